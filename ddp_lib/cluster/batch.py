"""Batch scripts for Slurm (``sbatch``) and PBS Pro (``qsub``), filled in from ``templates/``.

A template is the job file as a person would write it, with ``{{name}}`` where this job's values
go; a line that holds only a name whose value is empty is left out.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from ddp_lib.cluster.commands import (
    check_dataset,
    check_script,
    check_words,
    nproc_for,
    torchrun_command,
)
from ddp_lib.launching import torchrun
from ddp_lib.launching.torchrun import OWN_STORE_ENV, VARIABLE, check_int, check_port

TEMPLATES = Path(__file__).parent / "templates"
HEAD_NODE = "$HEAD_NODE"  # the batch scripts' variable for the first machine
PBS_LAUNCHERS = ("mpiexec", "torchrun")
# How each mpiexec binds a process to CPU cores, and where it puts the local rank:
# MPICH's (Hydra: -bind-to core:N), HPE Cray's (PALS, as on ALCF's Polaris and Aurora).
PBS_MPIS = {"mpich": (["-bind-to", "core:{depth}"], "MPI_LOCALRANKID"),
            "pals": (["--cpu-bind", "depth", "--depth", "{depth}"], "PMI_LOCAL_RANK")}

_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d{2}){0,2}")
_PBS_TIME = re.compile(r"\d+(:\d{2}){0,2}")  # [[hours:]minutes:]seconds
_PBS_JOB_NAME = re.compile(r"[A-Za-z0-9]\S{0,235}")  # qsub(1B), -N
_PBS_FILESYSTEM = re.compile(r"\w+")
_SHELL_SAFE = re.compile(r"[\w@%+=:,./-]+")
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def fill(template: str, **values: object) -> str:
    """``templates/<template>`` with each ``{{name}}`` replaced by ``values[name]``."""
    text = (TEMPLATES / template).read_text(encoding="utf-8")
    missing = set(_PLACEHOLDER.findall(text)) - set(values)
    if missing:
        raise KeyError(f"{template} needs {sorted(missing)}")
    lines = [line for line in text.splitlines()
             if not (_PLACEHOLDER.fullmatch(line) and values[line[2:-2]] in ("", None))]
    return _PLACEHOLDER.sub(lambda m: str(values[m[1]]), "\n".join(lines))


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
    port: int | None = None,
    partition: str | None = None,
    max_restarts: int = 0,
    workdir: str | os.PathLike | None = None,
    output: str = "%x-%j.out",
    dataset: str | None = "cifar10",
    notice_s: int | None = None,
) -> str:
    """An ``sbatch`` script that runs ``script`` on ``nodes`` machines with ``srun torchrun``:
    one task per node, torchrun, which starts the node's processes, one per GPU. Each size is
    written once, in the ``#SBATCH`` lines; the template says how the rest follows from them.

    Args:
        script: the training script, relative to ``workdir`` (a folder all nodes see).
        nodes: machines to allocate.
        gpus_per_node: GPUs per machine; 0 for a CPU job (no GPU line, no ``DDP_BACKEND=nccl``).
        cpus_per_task: CPU cores per machine, shared by its processes (data loading, Gloo).
        nproc_per_node: processes per machine; ``None``: one per GPU, or 1 on CPUs.
        args: the script's own arguments.
        job_name: the name ``squeue`` shows (``%x`` in ``output``).
        time_limit: wall-time limit, e.g. ``"00:30:00"`` or ``"1-00:00:00"``.
        port: the rendezvous port on the first node; ``None``: from the job's number.
        partition: the Slurm partition (queue); ``None``: the cluster's default.
        max_restarts: how often torchrun restarts the workers after a failure.
        workdir: the job's working folder; ``None``: the folder ``sbatch`` is run from.
        output: the log file, relative to the working folder (``%j``: the job id).
        dataset: ``DDP_WORKSHOP_DATASET``: ``"cifar10"`` (missing, an error), ``"synthetic"``,
            or ``None`` to leave it out.
        notice_s: seconds before the time limit at which the job asks its ranks to stop after
            their next checkpoint, then requeues itself; the script takes ``--resume`` and
            ``--stop-file`` (lesson 05's ``train_ddp_resume.py``). ``None``: no requeue.
    """
    check_int("nodes", nodes, low=1)
    check_int("gpus_per_node", gpus_per_node, low=0)
    check_int("cpus_per_task", cpus_per_task, low=1)
    nproc = nproc_for(nproc_per_node, gpus_per_node)
    if port is not None:
        check_port(port)
    check_words(job_name=job_name, partition=partition, output=output, workdir=workdir)
    if not isinstance(time_limit, str) or not _SLURM_TIME.fullmatch(time_limit):
        raise ValueError(f"time_limit must be Slurm's [days-]hours:minutes:seconds (or "
                         f"minutes), e.g. '00:30:00', got {time_limit!r}")
    if notice_s is not None:
        check_int("notice_s", notice_s, low=1)
        args = [*args, "--resume", "--stop-file", "$STOP_FILE"]
    port_word = "$PORT" if port is None else str(port)
    one_per_gpu = gpus_per_node and nproc == gpus_per_node
    command = torchrun_command(script, nnodes="$SLURM_JOB_NUM_NODES",
                               nproc_per_node="gpu" if one_per_gpu else nproc,
                               rdzv_endpoint=f"{HEAD_NODE}:{port_word}", args=args,
                               rdzv_id="$SLURM_JOB_ID", max_restarts=max_restarts)
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
        *([(f"--signal=B:USR1@{notice_s}", "USR1 to this shell that long before the limit"),
           ("--requeue", "the job may be put back in the queue"),
           ("--open-mode=append", "a requeued run adds to the log")] if notice_s else []),
    ]
    width = max(len(option) for option, _ in options) + len("#SBATCH ") + 2
    directives = "\n".join(f"{'#SBATCH ' + option:<{width}}# {why}" for option, why in options)
    srun = 'srun --cpus-per-task="$SLURM_CPUS_PER_TASK" '
    return fill("slurm.sbatch", script=os.fspath(script), nodes=nodes, nproc=nproc,
                world=nodes * nproc, directives=directives, port=port_word,
                port_from_job=fill("slurm_port_from_job.sh") if port is None else "",
                exports=_exports(gpus=bool(gpus_per_node), dataset=dataset),
                per_node="one process per GPU" if one_per_gpu else f"{nproc} process(es)",
                restarts=_restarts(max_restarts),
                requeue=fill("slurm_requeue.sh", notice=notice_s) if notice_s else "",
                command=srun + _continued(command) + (" &\nwait" if notice_s else "")) + "\n"


def _exports(*, gpus: bool, dataset: str | None) -> str:
    """What a job file tells every rank, so that a mistake on the cluster fails loudly."""
    check_dataset(dataset)
    parts = ["job_env_nccl.sh"] * gpus + [f"job_env_{dataset}.sh"] * (dataset is not None)
    return "\n".join(fill(part) for part in parts)


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
    dataset: str | None = "cifar10",
) -> str:
    """A PBS Pro batch script (``qsub FILE``) that runs ``script`` on ``nodes`` machines.

    PBS lists the job's machines in ``$PBS_NODEFILE``, one line per MPI process (``mpiprocs``);
    the batch script runs on the first, which hosts the group's store. The job is one of two
    forms (docs/how-it-works.md, "Job files", says what each line rests on):

    * ``launcher="mpiexec"``, no torchrun: ``mpiexec -n TOTAL --ppn PER_NODE python SCRIPT``.
      Each process maps mpiexec's variables (``PMI_RANK``, ``PMI_SIZE``, a local rank) onto
      torch's itself, as lesson 10's scripts do. Nothing restarts a failed process.
    * ``launcher="torchrun"``: ``mpiexec -n NODES --ppn 1 torchrun ...``, one agent per machine
      running :func:`slurm_script`'s command.

    With ``mpi`` named (``"mpich"``, Hydra; ``"pals"``, HPE Cray), the mpiexec form pins each
    process to its share of the cores and to one GPU (``CUDA_VISIBLE_DEVICES``; PALS in
    reverse, as ALCF does); the torchrun form gives each torchrun its machine's cores.

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
        port: the store (mpiexec) or rendezvous (torchrun) port; ``None``: from the job number.
        mpi: the site's mpiexec, to bind each process (mpiexec form); ``None``: no binding.
        queue: the PBS queue (``-q``); ``None``: the server's default.
        account: the project whose allocation is charged (``-A``); ``None``: the user's default.
        filesystems: ALCF's ``-l filesystems``, e.g. ``["home", "eagle"]``; empty: none.
        max_restarts: how often torchrun restarts the workers after a failure (torchrun only).
        workdir: the job's working folder; ``None``: the folder ``qsub`` is run from.
        dataset: ``DDP_WORKSHOP_DATASET``, as in :func:`slurm_script`.
    """
    check_int("nodes", nodes, low=1)
    check_int("gpus_per_node", gpus_per_node, low=0)
    check_int("cpus_per_node", cpus_per_node, low=1)
    exports = _exports(gpus=bool(gpus_per_node), dataset=dataset)
    nproc = nproc_for(nproc_per_node, gpus_per_node)
    if port is not None:
        check_port(port)
    check_int("max_restarts", max_restarts, low=0)
    if launcher not in PBS_LAUNCHERS:
        raise ValueError(f"launcher must be one of {PBS_LAUNCHERS}, got {launcher!r}")
    if mpi is not None and mpi not in PBS_MPIS:
        raise ValueError(f"mpi must be one of {tuple(PBS_MPIS)} or None, got {mpi!r}")
    if launcher == "mpiexec" and max_restarts:
        raise ValueError("max_restarts needs launcher='torchrun': mpiexec restarts nothing")
    check_script(script)
    check_words(queue=queue, account=account, workdir=workdir)
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
    if launcher == "mpiexec":
        launch = _pbs_mpiexec(script, nodes=nodes, nproc=nproc, port=port_word, args=args,
                              mpi=mpi, depth=max(1, cpus_per_node // nproc),
                              gpus=gpus_per_node)
    else:
        one_per_gpu = gpus_per_node and nproc == gpus_per_node
        command = torchrun_command(script, nnodes="$NNODES",
                                   nproc_per_node="gpu" if one_per_gpu else nproc,
                                   rdzv_endpoint=f"{HEAD_NODE}:{port_word}", args=args,
                                   rdzv_id="$PBS_JOBID", max_restarts=max_restarts)
        bind = ([word.format(depth=cpus_per_node) for word in PBS_MPIS[mpi][0]]
                if mpi else [])
        launch = fill(
            "pbs_torchrun.sh", restarts=_restarts(max_restarts),
            per_node="one process per GPU" if one_per_gpu else f"{nproc} process(es)",
            binding=(f"# torchrun and its processes get the machine's {cpus_per_node} cores "
                     f"({' '.join(bind)})." if bind else ""),
            bind="".join(f" {word}" for word in bind), command=_continued(command))
    cd = (f"cd {_shell_word(os.fspath(workdir))}  # the working folder, on a file system every "
          "node sees" if workdir else
          'cd "$PBS_O_WORKDIR"  # PBS starts in the home folder: work where qsub was run')
    return fill(
        "pbs.pbs", script=os.fspath(script), nodes=nodes, nproc=nproc, world=nodes * nproc,
        launcher=launcher, directives="\n".join(
            f"# {why}\n#PBS {directive}" for directive, why in directives),
        cd=cd, server="group's store" if launcher == "mpiexec" else "rendezvous",
        port_from_job=fill("pbs_port_from_job.sh") if port is None else "",
        endpoint="store" if launcher == "mpiexec" else "rendezvous", port=port_word,
        exports="\n" + exports if exports else "", launch=launch) + "\n"


def _pbs_mpiexec(script, *, nodes: int, nproc: int, port: str,
                 args: Sequence[str | int | float], mpi: str | None, depth: int,
                 gpus: int) -> str:
    """mpiexec starts every process; the script maps mpiexec's variables onto torch's."""
    mpiexec = ["mpiexec", "-n", str(nodes * nproc), "--ppn", str(nproc)]
    command = ["python", os.fspath(script), *torchrun.script_args(args)]
    if mpi is None:
        return fill("pbs_mpiexec.sh", nproc=nproc, binding="", port=port,
                    command=" ".join(_shell_word(word) for word in [*mpiexec, *command]))
    binding, local_rank = PBS_MPIS[mpi]
    binding = [word.format(depth=depth) for word in binding]
    said = [f"# Each process gets {depth} CPU core(s) of its own ({' '.join(binding)})"
            + (" and one GPU," if gpus else ".")]
    parts = [" ".join([*mpiexec, *binding])]
    if gpus:  # bash names the process's GPU, then becomes it (exec)
        # PALS: ALCF's set_affinity_gpu_polaris.sh's arithmetic; MPICH: the local rank's GPU
        gpu = f"$(({gpus} - 1 - {local_rank} % {gpus}))" if mpi == "pals" else f"${local_rank}"
        said.append(fill(f"pbs_gpu_{mpi}.sh"))
        parts.append(" ".join(_shell_word(word) for word in [
            "bash", "-c", f'export CUDA_VISIBLE_DEVICES={gpu}; exec "$@"',
            "gpu-per-process"]))
    parts.append(" ".join(_shell_word(word) for word in command))
    return fill("pbs_mpiexec.sh", nproc=nproc, binding="\n".join(said), port=port,
                command=" \\\n    ".join(parts))


def _restarts(max_restarts: int) -> str:
    """With restarts the workers need a store of their own: the one torchrun's agent serves
    them (torch 2.5 and later) keeps a failed attempt's addresses (``OWN_STORE_ENV``)."""
    if not max_restarts:
        return ""
    return fill("restarts.sh", exports="\n".join(f"export {k}={v}"
                                                 for k, v in OWN_STORE_ENV.items()))


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
