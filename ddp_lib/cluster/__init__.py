"""Job files for real clusters, all built from one ``torchrun`` command.

On a cluster nobody calls ``ddp_lib.launch``: a scheduler starts one ``torchrun`` agent per
machine, and the agents meet at a rendezvous endpoint (``host:port`` of one of the machines)
before starting their workers. With the ``c10d`` rendezvous the command is *the same on every
machine* (no node rank to hand out), so a Slurm batch script, a PBS batch script, a Kubernetes
``PyTorchJob`` and two shells reached by SSH differ only in how they name the first machine:

* Slurm: the first node of the allocation, ``$HEAD_NODE``, read by the batch script;
* PBS: the first line of ``$PBS_NODEFILE``, also ``$HEAD_NODE`` in the batch script;
* Kubernetes: ``$(MASTER_ADDR)``, which the Kubeflow training operator sets in every pod;
* SSH: the first host you list.

Kubeflow Trainer v2's ``TrainJob`` (the training operator's successor) runs the same script
with a plain ``torchrun`` and no options at all: its ``torch-distributed`` runtime puts every
option in the pod's environment (``PET_NNODES``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ...),
where ``torchrun`` reads what it is not given.

A PBS script can also leave torchrun out, as HPC centres' courses do: ``mpiexec`` starts every
process itself and the script reads its rank where ``mpiexec`` puts it.

This module writes those files as text (or a ``dict`` for Kubernetes: ``PyTorchJob``,
``TrainJob``); it runs nothing.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from typing import Any, Literal

import yaml

from ddp_lib import torchrun
from ddp_lib.torchrun import HOST, OWN_STORE_ENV, VARIABLE, check_int, check_port

PYTORCH_CONTAINER = "pytorch"  # the training operator finds the training container by this name
OPERATOR_PORT_NAME = "pytorchjob-port"  # the operator reads MASTER_PORT from the port so named
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"  # Kubeflow Trainer v2.0 to v2.3
K8S_ENDPOINT = "$(MASTER_ADDR):$(MASTER_PORT)"
HEAD_NODE = "$HEAD_NODE"  # the batch scripts' (Slurm, PBS) variable for the first machine
SLURM_JOB_ID = "$SLURM_JOB_ID"
PBS_JOB_ID = "$PBS_JOBID"
PBS_LAUNCHERS = ("mpiexec", "torchrun")
# How each mpiexec binds a process to CPU cores, and where it puts the local rank:
# MPICH's (Hydra: -bind-to core:N), HPE Cray's (PALS, as on ALCF's Polaris and Aurora).
PBS_MPIS = {"mpich": (["-bind-to", "core:{depth}"], "MPI_LOCALRANKID"),
            "pals": (["--cpu-bind", "depth", "--depth", "{depth}"], "PMI_LOCAL_RANK")}
# The batch script's port when none is given: from the job's number (PBS_JOBID, 1234.server).
PBS_PORT_FROM_JOB = ["JOB_NUMBER=${PBS_JOBID%%[!0-9]*}  # 1234 of 1234.server or 1234[5].server",
                     "PORT=$((20000 + JOB_NUMBER % 10000))"]

# An RFC 1035 label: both operators name Services after the job, and a Service's name is one.
_K8S_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d{2}){0,2}")
_PBS_TIME = re.compile(r"\d+(:\d{2}){0,2}")  # [[hours:]minutes:]seconds
_PBS_JOB_NAME = re.compile(r"[A-Za-z0-9]\S{0,235}")  # qsub(1B), -N
_PBS_FILESYSTEM = re.compile(r"\w+")
_SHELL_SAFE = re.compile(r"[\w@%+=:,./-]+")


def torchrun_command(
    script: str | os.PathLike,
    *,
    nnodes: int,
    nproc_per_node: int | str,
    rdzv_endpoint: str,
    args: Sequence[str | int | float] = (),
    rdzv_id: str = "ddp-workshop",
    max_restarts: int = 0,
) -> list[str]:
    """The ``torchrun`` command that every machine of a multi-node job runs, as a list.

    Args:
        script: the training script, a ``.py`` file (relative to the job's working folder).
        nnodes: number of machines, one ``torchrun`` agent each.
        nproc_per_node: processes per machine: a number, or torchrun's ``"gpu"``, ``"cpu"``,
            ``"auto"``.
        rdzv_endpoint: ``host:port`` every agent connects to; the host may be a variable that
            the machine fills in, e.g. ``"$HEAD_NODE:29500"`` (Slurm) or
            ``"$(MASTER_ADDR):$(MASTER_PORT)"`` (Kubernetes).
        args: the script's own arguments.
        rdzv_id: a name shared by the agents of one job (and no other job at the endpoint).
        max_restarts: how often torchrun restarts all workers after one fails.
    """
    _check_script(script)
    return torchrun.command(script, nnodes=nnodes, nproc_per_node=nproc_per_node,
                            rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
                            max_restarts=max_restarts, args=args)


def slurm_script(
    script: str | os.PathLike,
    *,
    nodes: int,
    gpus_per_node: int,
    cpus_per_task: int,
    nproc_per_node: int | None = None,
    args: Sequence[str | int | float] = (),
    job_name: str = "ddp-workshop",
    time_limit: str = "00:30:00",
    port: int = 29500,
    partition: str | None = None,
    max_restarts: int = 0,
    workdir: str | os.PathLike | None = None,
    output: str = "%x-%j.out",
) -> str:
    """An ``sbatch`` script that runs ``script`` on ``nodes`` machines with ``srun torchrun``.

    Slurm starts one task per node (``--ntasks-per-node=1``): that task is ``torchrun``, which
    starts the node's ``nproc_per_node`` processes, one per GPU. The first node of the
    allocation hosts the rendezvous and the job id names it, so two jobs never meet.

    Args:
        script: the training script, relative to ``workdir`` (a folder all nodes see).
        nodes: machines to allocate.
        gpus_per_node: GPUs per machine; 0 for a CPU job (then no GPU line is written).
        cpus_per_task: CPU cores per machine, shared by its processes (data loading, Gloo).
        nproc_per_node: processes per machine; ``None``: one per GPU, or 1 on CPUs.
        args: the script's own arguments.
        job_name: the name ``squeue`` shows (``%x`` in ``output``).
        time_limit: wall-time limit, e.g. ``"00:30:00"`` or ``"1-00:00:00"``.
        port: the rendezvous port on the first node.
        partition: the Slurm partition (queue); ``None``: the cluster's default.
        max_restarts: how often torchrun restarts the workers after a failure.
        workdir: the job's working folder; ``None``: the folder ``sbatch`` is run from.
        output: the log file, relative to the working folder (``%j``: the job id).
    """
    check_int("nodes", nodes, low=1)
    check_int("gpus_per_node", gpus_per_node, low=0)
    check_int("cpus_per_task", cpus_per_task, low=1)
    nproc = _nproc_for(nproc_per_node, gpus_per_node)
    check_port(port)
    _check_words(job_name=job_name, partition=partition, output=output, workdir=workdir)
    if not isinstance(time_limit, str) or not _SLURM_TIME.fullmatch(time_limit):
        raise ValueError(f"time_limit must be Slurm's [days-]hours:minutes:seconds (or "
                         f"minutes), e.g. '00:30:00', got {time_limit!r}")

    command = torchrun_command(script, nnodes=nodes, nproc_per_node=nproc,
                               rdzv_endpoint=f"{HEAD_NODE}:{port}", args=args,
                               rdzv_id=SLURM_JOB_ID, max_restarts=max_restarts)
    world = nodes * nproc
    options = [
        (f"--job-name={job_name}", "the name squeue shows; %x in the log file's name"),
        (f"--nodes={nodes}", "machines"),
        ("--ntasks-per-node=1", "one task per machine: torchrun, which starts its processes"),
        *([(f"--gpus-per-node={gpus_per_node}", "GPUs on each machine, one per process")]
          if gpus_per_node else []),
        (f"--cpus-per-task={cpus_per_task}", "CPU cores for each machine's processes"),
        (f"--time={time_limit}", "wall-time limit: Slurm stops the job after it"),
        *([(f"--partition={partition}", "the queue to wait in")] if partition else []),
        *([(f"--chdir={os.fspath(workdir)}", "working folder, on a file system every node sees")]
          if workdir else []),
        (f"--output={output}", "log file: %x job name, %j job id"),
    ]
    width = max(len(option) for option, _ in options) + len("#SBATCH ") + 2
    lines = [
        "#!/bin/bash",
        f"# {os.fspath(script)} on {nodes} node(s) x {nproc} process(es) = {world} process(es).",
        "# Submit with `sbatch FILE`; follow with `squeue --me` and the log file below.",
        *(f"{'#SBATCH ' + option:<{width}}# {why}" for option, why in options),
        "",
        "set -euo pipefail  # stop at the first failing command",
        "",
        "# The first node of the allocation hosts the rendezvous: every node's torchrun connects",
        "# to it there. This script runs on that node; srun starts the same command on each node.",
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f'echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST; rendezvous at $HEAD_NODE:{port}"',
        "",
        "# The job id names the rendezvous, so another job on the same nodes never joins it.",
        "# sbatch gives every node the environment it was submitted from: activate the Python",
        "# environment before sbatch: the script imports what is installed in it, and",
        "# course_helpers.py from its own folder. Nothing node-specific, such as a network",
        "# interface name, is set here, because it would be wrong on the other nodes.",
        *(_restart_lines() if max_restarts else []),
        _continued(["srun", *command]),
        "",
    ]
    return "\n".join(lines)


def pbs_script(
    script: str | os.PathLike,
    *,
    nodes: int,
    gpus_per_node: int,
    cpus_per_node: int,
    launcher: Literal["mpiexec", "torchrun"] = "mpiexec",
    nproc_per_node: int | None = None,
    args: Sequence[str | int | float] = (),
    job_name: str = "ddp-workshop",
    walltime: str = "00:30:00",
    port: int | None = None,
    mpi: Literal["mpich", "pals"] | None = None,
    queue: str | None = None,
    account: str | None = None,
    filesystems: Sequence[str] = (),
    max_restarts: int = 0,
    workdir: str | os.PathLike | None = None,
) -> str:
    """A PBS Pro batch script (``qsub FILE``) that runs ``script`` on ``nodes`` machines.

    PBS lists the job's machines in ``$PBS_NODEFILE``, one line per MPI process
    (``mpiprocs``), in the order of the chunks of ``-l select``; the batch script runs on the
    first one, which therefore hosts the group's store. ``mpiexec`` starts the processes on
    the listed machines: MPICH's reads ``$PBS_NODEFILE`` itself and reaches the other machines
    by ssh (password-less between a job's nodes, as PBS sites set up); on HPE Cray machines
    ``mpiexec`` (PALS) gets them from PBS. The job is one of two forms:

    * ``launcher="mpiexec"``, no torchrun: ``mpiexec -n TOTAL --ppn PER_NODE python SCRIPT``.
      Each process finds its rank, world size and local rank in mpiexec's variables
      (``PMI_RANK``, ``PMI_SIZE``, and ``MPI_LOCALRANKID`` from MPICH or ``PMI_LOCAL_RANK``
      on Cray machines), so the script maps them itself, as the lessons' scripts do;
      ``MASTER_ADDR`` and ``MASTER_PORT``, exported by the job, say where rank 0 serves the
      group's store. Nothing restarts a failed process (``max_restarts`` must be 0).
    * ``launcher="torchrun"``: ``mpiexec -n NODES --ppn 1 torchrun ...``, one torchrun agent
      per machine running :func:`slurm_script`'s command. Its workers inherit mpiexec's
      variables as well (there ``PMI_RANK`` is the machine's index), so a script that maps
      them must prefer torchrun's ``RANK``.

    With ``mpi`` named, the ``mpiexec`` form also pins each process, as HPC centres' job files
    do (ALCF's for Polaris: ``--cpu-bind depth --depth N`` and ``set_affinity_gpu_polaris.sh``):
    to ``cpus_per_node / nproc_per_node`` CPU cores of its own, in that MPI's words, and on a
    GPU machine to one GPU, its local rank's, through ``CUDA_VISIBLE_DEVICES`` (the script then
    sees one GPU and trains on ``cuda:0``). The two MPIs spell the binding and the local rank
    differently, so a job without ``mpi`` leaves both out: every process sees all the
    machine's GPUs and takes its local rank's.

    The store (or rendezvous) port is, unless ``port`` is given, taken from the job's number:
    two jobs that share the first machine get different ports unless their numbers differ by a
    multiple of 10000; a fixed port is safe only on machines that the job has to itself.

    The text is checked here and its body runs with MPICH's ``mpiexec`` on one machine that
    plays the nodes (``tests/test_pbs.py``). Only a real PBS server checks, at ``qsub``, what
    is site-specific: that the queue exists and admits this many nodes for this long, that the
    account exists and has allocation left, that the chunk's resources exist on its nodes
    (``ngpus`` is defined by each site, and sites add their own, such as ``system=polaris``),
    and which file systems it knows (``filesystems`` is ALCF's resource: required there,
    unknown elsewhere).

    Args:
        script: the training script, relative to ``workdir`` (a folder all nodes see).
        nodes: machines to allocate (chunks, one per machine).
        gpus_per_node: GPUs per machine; 0 for a CPU job (then no ``ngpus`` is asked for).
        cpus_per_node: CPU cores per machine, shared by its processes (data loading, Gloo).
        launcher: ``"mpiexec"`` starts every process; ``"torchrun"`` one torchrun per machine.
        nproc_per_node: processes per machine; ``None``: one per GPU, or 1 on CPUs.
        args: the script's own arguments.
        job_name: the name ``qstat`` shows; the log is ``NAME.oNUMBER``.
        walltime: wall-time limit, ``[[hours:]minutes:]seconds``, e.g. ``"00:30:00"``.
        port: on the first machine, the group's store (mpiexec) or the rendezvous (torchrun);
            ``None``: 20000 + the job's number modulo 10000.
        mpi: the site's mpiexec, ``"mpich"`` (Hydra) or ``"pals"`` (HPE Cray), to bind each
            process to its CPU cores and GPU (mpiexec form); ``None``: no binding.
        queue: the PBS queue (``-q``); ``None``: the server's default.
        account: the project whose allocation is charged (``-A``); ``None``: the user's default.
        filesystems: the file systems the job needs (ALCF's ``-l filesystems``, e.g.
            ``["home", "eagle"]``); empty: none asked for.
        max_restarts: how often torchrun restarts the workers after a failure (torchrun only).
        workdir: the job's working folder; ``None``: the folder ``qsub`` is run from.
    """
    check_int("nodes", nodes, low=1)
    check_int("gpus_per_node", gpus_per_node, low=0)
    check_int("cpus_per_node", cpus_per_node, low=1)
    nproc = _nproc_for(nproc_per_node, gpus_per_node)
    if port is not None:
        check_port(port)
    check_int("max_restarts", max_restarts, low=0)
    if launcher not in PBS_LAUNCHERS:
        raise ValueError(f"launcher must be one of {PBS_LAUNCHERS}, got {launcher!r}")
    if mpi is not None and mpi not in PBS_MPIS:
        raise ValueError(f"mpi must be one of {tuple(PBS_MPIS)} or None, got {mpi!r}")
    if launcher == "mpiexec" and max_restarts:
        raise ValueError("max_restarts needs launcher='torchrun': mpiexec restarts nothing")
    _check_script(script)
    _check_words(queue=queue, account=account, workdir=workdir)
    if not isinstance(job_name, str) or not _PBS_JOB_NAME.fullmatch(job_name):
        raise ValueError(f"job_name must start with a letter or digit, with no spaces and at "
                         f"most 236 characters (qsub -N), got {job_name!r}")
    if not isinstance(walltime, str) or not _PBS_TIME.fullmatch(walltime):
        raise ValueError(f"walltime must be PBS's [[hours:]minutes:]seconds, e.g. "
                         f"'00:30:00', got {walltime!r}")
    if isinstance(filesystems, str) or not all(
            isinstance(fs, str) and _PBS_FILESYSTEM.fullmatch(fs) for fs in filesystems):
        raise ValueError(f"filesystems must be a list of file system names, e.g. "
                         f"['home', 'eagle'], got {filesystems!r}")

    world = nodes * nproc
    port_word = "$PORT" if port is None else str(port)
    per_node = nproc if launcher == "mpiexec" else 1  # the processes mpiexec starts on each
    chunk = ":".join([f"ncpus={cpus_per_node}",
                      *([f"ngpus={gpus_per_node}"] if gpus_per_node else []),
                      f"mpiprocs={per_node}"])
    directives = [
        (f"-N {job_name}", "the name qstat shows; the log is NAME.oNUMBER"),
        (f"-l select={nodes}:{chunk}",
         f"{nodes} machine(s), each: {cpus_per_node} CPU cores"
         + (f", {gpus_per_node} GPUs" if gpus_per_node else "")
         + (f", {per_node} process(es) for mpiexec to start" if launcher == "mpiexec"
            else ", 1 process for mpiexec to start: torchrun")),
        ("-l place=scatter", "each chunk on a machine of its own"),
        (f"-l walltime={walltime}", "wall-time limit: PBS stops the job after it"),
        *([(f"-q {queue}", "the queue to wait in")] if queue else []),
        *([(f"-A {account}", "the project whose allocation is charged")] if account else []),
        *([(f"-l filesystems={':'.join(filesystems)}",
            "the file systems the job reads and writes, mounted on every node")]
          if filesystems else []),
        ("-j oe", "errors into the output: one log file"),
        ("-V", "the job gets the environment qsub is run from: activate the Python "
               "environment first"),
    ]
    lines = [
        "#!/bin/bash",
        f"# {os.fspath(script)} on {nodes} node(s) x {nproc} process(es) = {world} "
        f"process(es), started by {launcher}.",
        "# Submit with `qsub FILE`; follow with `qstat -u $USER` and the log file NAME.oNUMBER,",
        "# written to the folder qsub was run from. The line above each #PBS says what it asks.",
        *(line for directive, why in directives for line in (f"# {why}", f"#PBS {directive}")),
        "",
        "set -euo pipefail  # stop at the first failing command",
        "",
        *([f"cd {_shell_word(os.fspath(workdir))}  # the working folder, on a file system "
           "every node sees"] if workdir else
          ['cd "$PBS_O_WORKDIR"  # PBS starts in the home folder: work where qsub was run']),
        "",
        "# $PBS_NODEFILE lists the job's machines, one line per process that mpiexec starts,",
        "# the machine running this script first: it hosts the "
        + ("group's store" if launcher == "mpiexec" else "rendezvous")
        + ", under the name the node",
        "# file gives it, which the other machines reach it by.",
        'HEAD_NODE=$(head -n 1 "$PBS_NODEFILE")',
        *(["# Its port, from the job's number, so that two jobs on this machine do not pick the",
           "# same one; below the ports Linux gives outgoing connections (32768 and up).",
           *PBS_PORT_FROM_JOB] if port is None else []),
        f'echo "job $PBS_JOBID on $(uniq "$PBS_NODEFILE" | paste -sd " " -); '
        f'{"store" if launcher == "mpiexec" else "rendezvous"} at $HEAD_NODE:{port_word}"',
        "",
        *(_pbs_mpiexec_lines(script, nodes=nodes, nproc=nproc, port=port_word, args=args,
                             mpi=mpi, depth=max(1, cpus_per_node // nproc),
                             gpus=bool(gpus_per_node))
          if launcher == "mpiexec" else
          _pbs_torchrun_lines(script, nodes=nodes, nproc=nproc, port=port_word, args=args,
                              max_restarts=max_restarts)),
        "",
    ]
    return "\n".join(lines)


def _pbs_mpiexec_lines(script, *, nodes: int, nproc: int, port: str,
                       args: Sequence[str | int | float], mpi: str | None, depth: int,
                       gpus: bool) -> list[str]:
    """mpiexec starts every process; the script maps mpiexec's variables onto torch's."""
    lines = [
        f"# mpiexec starts {nproc} process(es) on each machine and tells each its rank in its",
        "# own variables (PMI_RANK, PMI_SIZE, a local rank), which the script maps onto",
        "# torch's. Rank 0 serves the group's store at MASTER_ADDR:MASTER_PORT. mpiexec hands",
        "# this environment to every process, on every machine.",
    ]
    mpiexec = ["mpiexec", "-n", str(nodes * nproc), "--ppn", str(nproc)]
    command = ["python", os.fspath(script), *torchrun.script_args(args)]
    if mpi is None:
        return [*lines, f"export MASTER_ADDR={HEAD_NODE} MASTER_PORT={port}",
                " ".join(_shell_word(word) for word in [*mpiexec, *command])]
    binding, local_rank = PBS_MPIS[mpi]
    binding = [word.format(depth=depth) for word in binding]
    lines.append(f"# Each process gets {depth} CPU core(s) of its own ({' '.join(binding)})"
                 + (" and one GPU, its" if gpus else "."))
    parts = [" ".join([*mpiexec, *binding])]
    if gpus:  # bash names the process's GPU, then becomes it (exec)
        lines += [f"# local rank's: bash sets CUDA_VISIBLE_DEVICES=${local_rank}, then becomes "
                  "python (exec), as",
                  "# ALCF's set_affinity_gpu_polaris.sh does; the script then sees one GPU, "
                  "cuda:0."]
        parts.append(" ".join(_shell_word(word) for word in [
            "bash", "-c", f'export CUDA_VISIBLE_DEVICES=${local_rank}; exec "$@"',
            "gpu-per-process"]))
    parts.append(" ".join(_shell_word(word) for word in command))
    return [*lines, f"export MASTER_ADDR={HEAD_NODE} MASTER_PORT={port}",
            " \\\n    ".join(parts)]


def _pbs_torchrun_lines(script, *, nodes: int, nproc: int, port: str,
                        args: Sequence[str | int | float], max_restarts: int) -> list[str]:
    """One torchrun per machine, started by mpiexec: the Slurm script's command."""
    command = torchrun_command(script, nnodes=nodes, nproc_per_node=nproc,
                               rdzv_endpoint=f"{HEAD_NODE}:{port}", args=args,
                               rdzv_id=PBS_JOB_ID, max_restarts=max_restarts)
    return [
        "# mpiexec starts one torchrun per machine (--ppn 1), the same command on each; torchrun",
        "# starts the machine's processes and sets RANK, LOCAL_RANK, ... for them (they also see",
        "# mpiexec's PMI_RANK, the machine's index: a script that reads both prefers RANK).",
        "# The job id names the rendezvous, so another job on the same nodes never joins it.",
        *(_restart_lines() if max_restarts else []),
        f"mpiexec -n {nodes} --ppn 1 {_continued(command)}",
    ]


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

    One pod per machine: a ``Master`` replica and ``nodes - 1`` ``Worker`` replicas, each
    running the same ``torchrun`` command as the Slurm script. The operator sets
    ``MASTER_ADDR`` (the master pod's name) and ``MASTER_PORT`` (the container port named
    ``pytorchjob-port``) in every pod, and Kubernetes substitutes ``$(NAME)`` in a container's
    command, so the rendezvous endpoint is ``$(MASTER_ADDR):$(MASTER_PORT)``. The operator also
    sets ``RANK`` and ``WORLD_SIZE``, counting pods, and from its v1.7 the ``PET_*`` variables
    that ``torchrun`` reads for options it is not given (``PET_NNODES``, ``PET_NODE_RANK``,
    ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``, ``PET_NPROC_PER_NODE``, ``auto`` by default);
    the command names its rendezvous and sizes, so it stays on ``c10d``, where
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` applies. Run:ai's ``runai submit-dist pytorch``
    creates such a job: ``--workers`` Worker pods beside the Master, ``-g`` GPUs each (lesson
    06 builds the command from this manifest). Write it with :func:`to_yaml` and submit with
    ``kubectl apply -f FILE``.

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

    Kubeflow now recommends Trainer v2 over the training operator's ``PyTorchJob``. A
    ``TrainJob`` says only what is particular to this job (image, command, nodes, processes,
    resources) and names a runtime, the ``ClusterTrainingRuntime`` its cluster's administrator
    installed (``torch-distributed`` is Trainer's own), which holds the pod template; Trainer
    turns the two into a JobSet with one pod per node. What each field here rests on, from
    Kubeflow Trainer's sources (v2.0 to v2.3):

    * ``trainer.command`` is the training container's whole command: nothing is put before
      it, so it runs ``torchrun`` itself, as Kubeflow's own Python SDK does. It gives
      ``torchrun`` no options: the runtime's torch plugin sets ``PET_NNODES``,
      ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (the pod's index), ``PET_MASTER_ADDR`` (the
      first pod) and ``PET_MASTER_PORT`` in every pod, and ``torchrun`` reads each option it
      is not given from ``PET_<OPTION>``. The rendezvous is therefore ``torchrun``'s
      ``static`` one; its elastic restarts (``max_restarts``) are left out, as the plugin
      leaves elastic PyTorch for later. Those five variables are the plugin's: Trainer
      refuses a ``trainer.env`` that sets one.
    * ``numProcPerNode`` is always written: the runtime's default, ``auto``, starts one
      process per CPU core on a pod that asks for no GPU. An integer is what every v2
      release accepts (``"auto"``, ``"cpu"``, ``"gpu"`` only up to v2.1).
    * ``resourcesPerNode`` asks for the same limits as the ``PyTorchJob``'s containers.
    * Nothing about the pod beyond that (volumes such as a larger ``/dev/shm``, node
      selectors) is written: that belongs to the runtime, or to a patch of it whose field
      changed name from release to release (``podSpecOverrides``, ``podTemplateOverrides``,
      ``runtimePatches``).

    Write it with :func:`to_yaml` and submit with ``kubectl apply -f FILE``.

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
    _check_script(script)
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
    nproc = _nproc_for(nproc_per_node, gpus_per_node)
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


def host_commands(
    script: str | os.PathLike,
    *,
    hosts: Sequence[str],
    nproc_per_node: int | str,
    port: int = 29500,
    args: Sequence[str | int | float] = (),
    max_restarts: int = 0,
    rdzv_id: str = "ddp-workshop",
) -> list[list[str]]:
    """The command to type on each of ``hosts``, in order: the same command on every one.

    The first host is the rendezvous endpoint, so every host must reach it by that name
    (and the other hosts by theirs: the agents tell each other their host names). With
    ``max_restarts``, run it with ``OWN_STORE_ENV`` in its environment, as
    :func:`ssh_commands` does.
    """
    hosts = _check_hosts(hosts)
    check_port(port)
    command = torchrun_command(script, nnodes=len(hosts), nproc_per_node=nproc_per_node,
                               rdzv_endpoint=f"{hosts[0]}:{port}", args=args,
                               rdzv_id=rdzv_id, max_restarts=max_restarts)
    return [list(command) for _ in hosts]


def ssh_commands(
    script: str | os.PathLike,
    *,
    hosts: Sequence[str],
    nproc_per_node: int | str,
    port: int = 29500,
    args: Sequence[str | int | float] = (),
    max_restarts: int = 0,
    workdir: str | os.PathLike | None = None,
) -> list[str]:
    """``ssh HOST '[cd WORKDIR &&] torchrun ...'`` for each host: one terminal per machine.

    The job starts when all of them have connected; the remote command is exactly
    :func:`host_commands`'s. ssh runs it in a shell that activates nothing, so each host's
    ``PATH`` must lead to the Python environment's ``torchrun`` (or type the command in a
    terminal on each machine, with the environment activated).
    """
    commands = host_commands(script, hosts=hosts, nproc_per_node=nproc_per_node, port=port,
                             args=args, max_restarts=max_restarts)
    if workdir is not None:
        workdir = os.fspath(workdir)
        # A leading ~ stays unquoted so that the remote shell expands it to the home folder.
        if not re.fullmatch(r"~?[\w@%+=:,./-]*", workdir):
            workdir = shlex.quote(workdir)
    prefix = f"cd {workdir} && " if workdir else ""
    if max_restarts:
        prefix += "".join(f"{k}={v} " for k, v in OWN_STORE_ENV.items())
    return [f"ssh {host} {shlex.quote(prefix + shlex.join(command))}"
            for host, command in zip(hosts, commands, strict=True)]


def _check_words(**values: str | os.PathLike | None) -> None:
    """Each value (if given) is one word: a job file's directives and commands split on spaces."""
    for name, value in values.items():
        if value is not None and (not isinstance(value, (str, os.PathLike))
                                  or not os.fspath(value) or re.search(r"\s", os.fspath(value))):
            raise ValueError(f"{name} must be a non-empty string without spaces, got {value!r}")


def _restart_lines() -> list[str]:
    """With restarts the workers need a store of their own: the one torchrun's agent serves
    them (torch 2.5 and later) keeps a failed attempt's addresses (``ddp_lib.torchrun``)."""
    return ["# A restarted group must not read the failed attempt's addresses from torchrun's",
            "# store: give the workers a store of their own.",
            *(f"export {k}={v}" for k, v in OWN_STORE_ENV.items())]


def _check_script(script) -> None:
    if not isinstance(script, (str, os.PathLike)) or not os.fspath(script).endswith(".py"):
        raise ValueError(f"script must be a Python file name like 'train_ddp.py', got {script!r}")
    if re.search(r"\s", os.fspath(script)):
        raise ValueError(f"script must not contain spaces (job files split on them), "
                         f"got {script!r}")


def _nproc_for(nproc_per_node: int | None, gpus_per_node: int) -> int:
    """Processes per node: one per GPU unless told otherwise, and never more than GPUs."""
    if nproc_per_node is None:
        return gpus_per_node or 1
    check_int("nproc_per_node", nproc_per_node, low=1)
    if gpus_per_node and nproc_per_node > gpus_per_node:
        raise ValueError(f"nproc_per_node={nproc_per_node} > gpus_per_node={gpus_per_node}: "
                         "each process needs a GPU of its own. Ask for more GPUs or fewer "
                         "processes.")
    return nproc_per_node


def _check_hosts(hosts) -> list[str]:
    if isinstance(hosts, str) or not isinstance(hosts, Sequence) or not hosts:
        raise ValueError(f"hosts must be a list of host names, first the rendezvous host, "
                         f"got {hosts!r}")
    for host in hosts:
        if not isinstance(host, str) or not HOST.fullmatch(host) or host.startswith("$"):
            raise ValueError(f"host {host!r} is not a host name or address")
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"hosts must be distinct machines, got {list(hosts)}; for more "
                         "processes on one machine raise nproc_per_node instead")
    return list(hosts)


def _shell_word(word: str) -> str:
    """``word`` for a shell line: variables stay live inside double quotes, the rest quoted."""
    if _SHELL_SAFE.fullmatch(word):
        return word
    if "$" in word and re.fullmatch(rf"(?:[\w@%+=:,./-]|{VARIABLE})+", word):
        return f'"{word}"'
    return shlex.quote(word)


def _continued(words: Sequence[str]) -> str:
    """A long command with its leading ``--options`` one per line, as people write them."""
    first = next(i for i, word in enumerate(words) if word.startswith("--"))
    last = next(i for i in range(first, len(words)) if not words[i].startswith("--"))
    lines = [" ".join(_shell_word(w) for w in words[:first]),
             *(_shell_word(w) for w in words[first:last]),
             " ".join(_shell_word(w) for w in words[last:])]
    return " \\\n    ".join(lines)
