"""Kubernetes jobs: the training operator's ``PyTorchJob`` and Kubeflow Trainer v2's ``TrainJob``.

Both run one ``torchrun`` agent per pod. They are built as ``dict``s (write them with
:func:`to_yaml`, submit with ``kubectl apply -f FILE``); what each field rests on, from the
operators' sources, is in docs/how-it-works.md, "Job files".
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import yaml

from ddp_lib.cluster.commands import check_script, nproc_for, torchrun_command
from ddp_lib.launching import torchrun
from ddp_lib.launching.torchrun import OWN_STORE_ENV, check_int, check_port

PYTORCH_CONTAINER = "pytorch"  # the training operator finds the training container by this name
OPERATOR_PORT_NAME = "pytorchjob-port"  # the operator reads MASTER_PORT from the port so named
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"  # Kubeflow Trainer v2.0 to v2.3
K8S_ENDPOINT = "$(MASTER_ADDR):$(MASTER_PORT)"
# An RFC 1035 label: both operators name Services after the job, and a Service's name is one.
_K8S_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def pytorchjob_manifest(
    script: str | os.PathLike,
    *,
    nodes: int,
    gpus_per_node: int,
    cpus_per_node: int,
    image: str,
    nproc_per_node: int | None = None,
    args: Sequence[str | int | float] = (),
    name: str = "ddp-workshop",
    port: int = 29500,
    max_restarts: int = 0,
) -> dict[str, Any]:
    """A Kubeflow training operator ``PyTorchJob`` (``kubeflow.org/v1``) as a ``dict``.

    One pod per machine, a ``Master`` and ``nodes - 1`` ``Worker`` replicas, each running the
    Slurm script's ``torchrun`` command with the rendezvous at ``$(MASTER_ADDR):$(MASTER_PORT)``,
    which the operator sets in every pod.

    Args:
        script: the training script, relative to the image's working folder.
        nodes: pods (machines), one ``torchrun`` agent each.
        gpus_per_node: GPUs per pod (``nvidia.com/gpu``); 0 for a CPU job.
        cpus_per_node: CPU cores per pod.
        image: a container image with PyTorch, the script and what it imports installed
            (``ddp_lib`` for the course's scripts).
        nproc_per_node: processes per pod; ``None``: one per GPU, or 1 on CPUs.
        args: the script's own arguments.
        name: the job's name; pods are called ``NAME-master-0``, ``NAME-worker-0``, ...
        port: the rendezvous port on the master pod.
        max_restarts: how often torchrun restarts the workers after a failure.
    """
    nproc = _check_k8s_job(nodes=nodes, gpus_per_node=gpus_per_node,
                           cpus_per_node=cpus_per_node, nproc_per_node=nproc_per_node,
                           image=image, name=name)
    check_port(port)
    command = torchrun_command(script, nnodes=nodes, nproc_per_node=nproc,
                               rdzv_endpoint=K8S_ENDPOINT, args=args, rdzv_id=name,
                               max_restarts=max_restarts)
    limits = _pod_limits(cpus_per_node=cpus_per_node, gpus_per_node=gpus_per_node)

    def replicas(count: int) -> dict[str, Any]:
        container = {
            "name": PYTORCH_CONTAINER,
            "image": image,
            "command": list(command),
            "ports": [{"name": OPERATOR_PORT_NAME, "containerPort": port}],
            "resources": {"limits": dict(limits)},  # each replica its own
            **({"env": [{"name": k, "value": v} for k, v in OWN_STORE_ENV.items()]}
               if max_restarts else {}),
            # Processes on one machine exchange data through /dev/shm (DataLoader workers,
            # NCCL); a container's default is only 64 MB.
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        }
        pod = {"containers": [container],
               "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]}
        # torchrun restarts failed workers itself (max_restarts); a failed pod ends the job.
        return {"replicas": count, "restartPolicy": "Never", "template": {"spec": pod}}

    specs = {"Master": replicas(1)}
    if nodes > 1:
        specs["Worker"] = replicas(nodes - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {"pytorchReplicaSpecs": specs},
    }


def trainjob_manifest(
    script: str | os.PathLike,
    *,
    nodes: int,
    gpus_per_node: int,
    cpus_per_node: int,
    image: str,
    nproc_per_node: int | None = None,
    args: Sequence[str | int | float] = (),
    name: str = "ddp-workshop",
    runtime: str = "torch-distributed",
) -> dict[str, Any]:
    """A Kubeflow Trainer v2 ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) as a ``dict``.

    Kubeflow's successor to the ``PyTorchJob``: the job names a runtime (a
    ``ClusterTrainingRuntime``, which holds the pod template) and runs plain ``torchrun`` with no
    options; the runtime's torch plugin puts them in each pod's ``PET_*`` variables.

    Args:
        script: the training script, relative to the image's working folder.
        nodes: pods (machines), one ``torchrun`` agent each.
        gpus_per_node: GPUs per pod (``nvidia.com/gpu``); 0 for a CPU job.
        cpus_per_node: CPU cores per pod.
        image: a container image with PyTorch, the script and what it imports installed
            (``ddp_lib`` for the course's scripts); it replaces the runtime's image.
        nproc_per_node: processes per pod; ``None``: one per GPU, or 1 on CPUs.
        args: the script's own arguments.
        name: the job's name; pods are called ``NAME-node-0-0-*``, ``NAME-node-0-1-*``, ...
        runtime: the ``ClusterTrainingRuntime`` to run in (``kubectl get
            clustertrainingruntimes`` lists a cluster's).
    """
    nproc = _check_k8s_job(nodes=nodes, gpus_per_node=gpus_per_node,
                           cpus_per_node=cpus_per_node, nproc_per_node=nproc_per_node,
                           image=image, name=name)
    if not isinstance(runtime, str) or not _K8S_NAME.fullmatch(runtime):
        raise ValueError(f"runtime must name a ClusterTrainingRuntime, e.g. "
                         f"'torch-distributed', got {runtime!r}")
    check_script(script)
    return {
        "apiVersion": TRAINJOB_API,
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": runtime, "kind": "ClusterTrainingRuntime",
                           "apiGroup": TRAINJOB_API.split("/")[0]},
            "trainer": {
                "image": image,
                "command": ["torchrun", os.fspath(script), *torchrun.script_args(args)],
                "numNodes": nodes,
                "numProcPerNode": nproc,
                "resourcesPerNode": {
                    "limits": _pod_limits(cpus_per_node=cpus_per_node,
                                          gpus_per_node=gpus_per_node)},
            },
        },
    }


def _check_k8s_job(*, nodes: int, gpus_per_node: int, cpus_per_node: int,
                   nproc_per_node: int | None, image: str, name: str) -> int:
    """What both Kubernetes jobs take; returns the processes per pod."""
    check_int("nodes", nodes, low=1)
    check_int("gpus_per_node", gpus_per_node, low=0)
    check_int("cpus_per_node", cpus_per_node, low=1)
    nproc = nproc_for(nproc_per_node, gpus_per_node)
    if not isinstance(image, str) or not image or re.search(r"\s", image):
        raise ValueError(f"image must name a container image, e.g. "
                         f"'pytorch/pytorch:latest', got {image!r}")
    if not isinstance(name, str) or len(name) > 40 or not _K8S_NAME.fullmatch(name):
        raise ValueError(f"name must be lower-case letters, digits and '-', starting with a "
                         f"letter (at most 40: it becomes part of the pods' names), "
                         f"got {name!r}")
    return nproc


def _pod_limits(*, cpus_per_node: int, gpus_per_node: int) -> dict[str, int]:
    """A pod's resource limits: its CPU cores, and its GPUs if it has any."""
    return {"cpu": cpus_per_node, **({"nvidia.com/gpu": gpus_per_node} if gpus_per_node else {})}


class _PlainDumper(yaml.SafeDumper):
    """Writes repeated parts out in full: a reader should not have to follow ``*id001``."""

    def ignore_aliases(self, data) -> bool:
        return True


def to_yaml(manifest: dict[str, Any]) -> str:
    """``manifest`` as YAML, in the order it was built (``kind`` first, not sorted)."""
    return yaml.dump(manifest, Dumper=_PlainDumper, sort_keys=False, default_flow_style=False,
                     width=100)
