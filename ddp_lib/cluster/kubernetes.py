"""Kubernetes jobs: the training operator's ``PyTorchJob`` and Kubeflow Trainer v2's ``TrainJob``.

Both run one ``torchrun`` agent per pod, in a pinned PyTorch image, on scripts that a ConfigMap
carries (``kubectl create configmap NAME --from-file=SCRIPT --from-file=course_helpers.py``).
Every pod mounts a large ``/dev/shm`` and, if given a claim, a volume for the checkpoint; each
pod's own local rank 0 prepares its data, since pods share no disk. They are built as ``dict``s
(write them with :func:`to_yaml`, submit with ``kubectl apply -f FILE``); what each field rests
on, from the operators' sources, is in docs/how-it-works.md, "Job files".
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import yaml

from ddp_lib.cluster.commands import check_dataset, check_script, nproc_for, torchrun_command
from ddp_lib.launching import torchrun
from ddp_lib.launching.torchrun import OWN_STORE_ENV, check_int, check_port

PYTORCH_CONTAINER = "pytorch"  # the training operator finds the training container by this name
OPERATOR_PORT_NAME = "pytorchjob-port"  # the operator reads MASTER_PORT from the port so named
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"  # Kubeflow Trainer v2.2, v2.3 (runtimePatches)
TRAINJOB_NODE = "node"  # the torch-distributed runtime's replicated job, and its container
# The image of Kubeflow Trainer v2.3.0's torch-distributed runtime (torch, torchvision; its
# working folder is /workspace): pinned, so that a job runs the same torch next year.
PYTORCH_IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
SCRIPTS_CONFIGMAP = "ddp-workshop-scripts"  # kubectl create configmap ddp-workshop-scripts ...
SCRIPTS_DIR = "/workspace/scripts"  # the ConfigMap's files, read-only
DATA_DIR = "/workspace/data"  # in each pod's own file system
CHECKPOINT_DIR = "/checkpoints"  # the claim's volume, when the job names one
K8S_ENDPOINT = "$(MASTER_ADDR):$(MASTER_PORT)"
# An RFC 1035 label: both operators name Services after the job, and a Service's name is one.
_K8S_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_K8S_OBJECT = re.compile(r"[a-z0-9]([-.a-z0-9]*[a-z0-9])?")  # RFC 1123 subdomain: a ConfigMap's


def pytorchjob_manifest(
    script: str | os.PathLike,
    *,
    nodes: int,
    gpus_per_node: int,
    cpus_per_node: int,
    scripts: str = SCRIPTS_CONFIGMAP,
    checkpoint_claim: str | None = None,
    image: str = PYTORCH_IMAGE,
    nproc_per_node: int | None = None,
    args: Sequence[str | int | float] = (),
    dataset: str | None = "cifar10",
    name: str = "ddp-workshop",
    port: int = 29500,
    max_restarts: int = 0,
) -> dict[str, Any]:
    """A Kubeflow training operator ``PyTorchJob`` (``kubeflow.org/v1``) as a ``dict``.

    One pod per machine, a ``Master`` and ``nodes - 1`` ``Worker`` replicas, each running the
    Slurm script's ``torchrun`` command with the rendezvous at ``$(MASTER_ADDR):$(MASTER_PORT)``,
    which the operator sets in every pod.

    Args:
        script: the training script's file name in the ConfigMap.
        nodes: pods (machines), one ``torchrun`` agent each.
        gpus_per_node: GPUs per pod (``nvidia.com/gpu``); 0 for a CPU job.
        cpus_per_node: CPU cores per pod.
        scripts: the ConfigMap holding the script and what it imports, mounted at
            ``SCRIPTS_DIR``.
        checkpoint_claim: a PersistentVolumeClaim mounted at ``CHECKPOINT_DIR`` in every pod
            (ReadWriteMany for more than one node); pass the script a checkpoint path there.
        image: a container image with PyTorch and torchvision.
        nproc_per_node: processes per pod; ``None``: one per GPU, or 1 on CPUs.
        args: the script's own arguments.
        dataset: ``DDP_WORKSHOP_DATASET`` in every pod: ``"cifar10"`` (downloaded, or an
            error), ``"synthetic"``, or ``None`` (real if it can be had).
        name: the job's name; pods are called ``NAME-master-0``, ``NAME-worker-0``, ...
        port: the rendezvous port on the master pod.
        max_restarts: how often torchrun restarts the workers after a failure.
    """
    nproc = _check_k8s_job(script, nodes=nodes, gpus_per_node=gpus_per_node,
                           cpus_per_node=cpus_per_node, nproc_per_node=nproc_per_node,
                           image=image, name=name, scripts=scripts,
                           checkpoint_claim=checkpoint_claim)
    check_port(port)
    command = torchrun_command(f"{SCRIPTS_DIR}/{script}", nnodes=nodes, nproc_per_node=nproc,
                               rdzv_endpoint=K8S_ENDPOINT, args=args, rdzv_id=name,
                               max_restarts=max_restarts)
    limits = _pod_limits(cpus_per_node=cpus_per_node, gpus_per_node=gpus_per_node)
    env = _job_env(gpus=bool(gpus_per_node), dataset=dataset,
                   extra=OWN_STORE_ENV if max_restarts else {})

    def replicas(count: int) -> dict[str, Any]:
        volumes, mounts = _volumes(scripts, checkpoint_claim)
        container = {
            "name": PYTORCH_CONTAINER,
            "image": image,
            "command": list(command),
            "ports": [{"name": OPERATOR_PORT_NAME, "containerPort": port}],
            "resources": {"limits": dict(limits)},  # each replica its own
            "env": [dict(variable) for variable in env],
            "volumeMounts": mounts,
        }
        pod = {"containers": [container], "volumes": volumes}
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
    scripts: str = SCRIPTS_CONFIGMAP,
    checkpoint_claim: str | None = None,
    image: str = PYTORCH_IMAGE,
    nproc_per_node: int | None = None,
    args: Sequence[str | int | float] = (),
    dataset: str | None = "cifar10",
    name: str = "ddp-workshop",
    runtime: str = "torch-distributed",
) -> dict[str, Any]:
    """A Kubeflow Trainer v2 ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) as a ``dict``.

    Kubeflow's successor to the ``PyTorchJob``: the job names a runtime (a
    ``ClusterTrainingRuntime``, which holds the pod template) and runs plain ``torchrun`` with no
    options; the runtime's torch plugin puts them in each pod's ``PET_*`` variables. The volumes
    go into the runtime's pod template through ``runtimePatches`` (Trainer v2.2 and later).

    Args: as :func:`pytorchjob_manifest`'s, and
        name: the job's name; pods are called ``NAME-node-0-0-*``, ``NAME-node-0-1-*``, ...
        runtime: the ``ClusterTrainingRuntime`` to run in (``kubectl get
            clustertrainingruntimes`` lists a cluster's).
    """
    nproc = _check_k8s_job(script, nodes=nodes, gpus_per_node=gpus_per_node,
                           cpus_per_node=cpus_per_node, nproc_per_node=nproc_per_node,
                           image=image, name=name, scripts=scripts,
                           checkpoint_claim=checkpoint_claim)
    if not isinstance(runtime, str) or not _K8S_NAME.fullmatch(runtime):
        raise ValueError(f"runtime must name a ClusterTrainingRuntime, e.g. "
                         f"'torch-distributed', got {runtime!r}")
    volumes, mounts = _volumes(scripts, checkpoint_claim)
    pod = {"volumes": volumes, "containers": [{"name": TRAINJOB_NODE, "volumeMounts": mounts}]}
    return {
        "apiVersion": TRAINJOB_API,
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": runtime, "kind": "ClusterTrainingRuntime",
                           "apiGroup": TRAINJOB_API.split("/")[0]},
            "trainer": {
                "image": image,
                "command": ["torchrun", f"{SCRIPTS_DIR}/{script}",
                            *torchrun.script_args(args)],
                "env": _job_env(gpus=bool(gpus_per_node), dataset=dataset),
                "numNodes": nodes,
                "numProcPerNode": nproc,
                "resourcesPerNode": {
                    "limits": _pod_limits(cpus_per_node=cpus_per_node,
                                          gpus_per_node=gpus_per_node)},
            },
            "runtimePatches": [{"manager": "ddp-workshop", "trainingRuntimeSpec": {"template": {
                "spec": {"replicatedJobs": [{"name": TRAINJOB_NODE, "template": {
                    "spec": {"template": {"spec": pod}}}}]}}}}],
        },
    }


def volume_claim(name: str, size: str = "1Gi") -> dict[str, Any]:
    """A ``PersistentVolumeClaim`` for the checkpoint, which every pod of a job mounts.

    ``ReadWriteMany``, since the pods run on several machines; the cluster's default storage
    class must offer it (a network file system does), or the claim stays ``Pending``.
    """
    if not isinstance(name, str) or not _K8S_OBJECT.fullmatch(name):
        raise ValueError(f"name must be lower-case letters, digits, '-' and '.', got {name!r}")
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteMany"],
                     "resources": {"requests": {"storage": size}}}}


def _check_k8s_job(script, *, nodes: int, gpus_per_node: int, cpus_per_node: int,
                   nproc_per_node: int | None, image: str, name: str, scripts: str,
                   checkpoint_claim: str | None) -> int:
    """What both Kubernetes jobs take; returns the processes per pod."""
    check_script(script)
    if "/" in os.fspath(script):
        raise ValueError(f"script must be a file name in the ConfigMap, e.g. 'train_ddp.py', "
                         f"got {script!r}")
    check_int("nodes", nodes, low=1)
    check_int("gpus_per_node", gpus_per_node, low=0)
    check_int("cpus_per_node", cpus_per_node, low=1)
    nproc = nproc_for(nproc_per_node, gpus_per_node)
    if not isinstance(image, str) or not image or re.search(r"\s", image):
        raise ValueError(f"image must name a container image, e.g. "
                         f"'pytorch/pytorch:latest', got {image!r}")
    for what, value in (("scripts", scripts), ("checkpoint_claim", checkpoint_claim)):
        if value is not None and (not isinstance(value, str) or len(value) > 253
                                  or not _K8S_OBJECT.fullmatch(value)):
            raise ValueError(f"{what} must name a {'ConfigMap' if what == 'scripts' else 'claim'}"
                             f" (lower-case letters, digits, '-' and '.'), got {value!r}")
    if not isinstance(name, str) or len(name) > 40 or not _K8S_NAME.fullmatch(name):
        raise ValueError(f"name must be lower-case letters, digits and '-', starting with a "
                         f"letter (at most 40: it becomes part of the pods' names), "
                         f"got {name!r}")
    return nproc


def _volumes(scripts: str, checkpoint_claim: str | None) -> tuple[list[dict], list[dict]]:
    """Every pod's volumes, and where its training container mounts them."""
    volumes = [{"name": "scripts", "configMap": {"name": scripts}},
               # Processes on one machine exchange data through /dev/shm (DataLoader workers,
               # NCCL); a container's default is only 64 MB.
               {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    mounts = [{"name": "scripts", "mountPath": SCRIPTS_DIR, "readOnly": True},
              {"name": "dshm", "mountPath": "/dev/shm"}]
    if checkpoint_claim:
        volumes.append({"name": "checkpoints",
                        "persistentVolumeClaim": {"claimName": checkpoint_claim}})
        mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_DIR})
    return volumes, mounts


def _job_env(*, gpus: bool, dataset: str | None,
             extra: dict[str, str] | None = None) -> list[dict[str, str]]:
    """What every rank is told (as the batch scripts' exports): the data in the pod's own file
    system, the backend a GPU job must get, the data set, so that a mistake fails loudly."""
    check_dataset(dataset)
    env = {"DDP_WORKSHOP_DATA_DIR": DATA_DIR, **({"DDP_BACKEND": "nccl"} if gpus else {}),
           **({"DDP_WORKSHOP_DATASET": dataset} if dataset else {}), **(extra or {})}
    return [{"name": k, "value": v} for k, v in env.items()]


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
