"""The torchrun command of a multi-node job, per machine and over ssh, and the checks that every
job file shares."""

from __future__ import annotations

import os
import re
import shlex
import zlib
from collections.abc import Sequence

from ddp_lib.launching import torchrun
from ddp_lib.launching.torchrun import HOST, OWN_STORE_ENV, check_int, check_port


def torchrun_command(
    script: str | os.PathLike,
    *,
    nnodes: int | str,
    nproc_per_node: int | str,
    rdzv_endpoint: str,
    args: Sequence[str | int | float] = (),
    rdzv_id: str = "ddp-workshop",
    max_restarts: int = 0,
) -> list[str]:
    """The ``torchrun`` command that every machine of a multi-node job runs, as a list.

    Args:
        script: the training script, a ``.py`` file (relative to the job's working folder).
        nnodes: number of machines, one ``torchrun`` agent each, or the scheduler's variable
            for it (``"$SLURM_JOB_NUM_NODES"``).
        nproc_per_node: processes per machine: a number, or torchrun's ``"gpu"``, ``"cpu"``,
            ``"auto"``.
        rdzv_endpoint: ``host:port`` every agent connects to; the host may be a variable that
            the machine fills in, e.g. ``"$HEAD_NODE:29500"`` (Slurm) or
            ``"$(MASTER_ADDR):$(MASTER_PORT)"`` (Kubernetes).
        args: the script's own arguments.
        rdzv_id: a name shared by the agents of one job (and no other job at the endpoint).
        max_restarts: how often torchrun restarts all workers after one fails.
    """
    check_script(script)
    return torchrun.command(script, nnodes=nnodes, nproc_per_node=nproc_per_node,
                            rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
                            max_restarts=max_restarts, args=args)


def host_commands(
    script: str | os.PathLike,
    *,
    hosts: Sequence[str],
    nproc_per_node: int | str,
    port: int | None = None,
    args: Sequence[str | int | float] = (),
    max_restarts: int = 0,
    rdzv_id: str = "ddp-workshop",
) -> list[list[str]]:
    """The command to type on each of ``hosts``, in order: the same command on every one.

    The first host is the rendezvous endpoint, so every host must reach it by that name (and the
    other hosts by theirs: the agents tell each other their host names). With ``max_restarts``,
    run it with ``OWN_STORE_ENV`` in its environment, as :func:`ssh_commands` does. ``port``
    ``None``: :func:`job_port` of ``rdzv_id``.
    """
    hosts = _check_hosts(hosts)
    port = job_port(rdzv_id) if port is None else port
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
    port: int | None = None,
    args: Sequence[str | int | float] = (),
    max_restarts: int = 0,
    rdzv_id: str = "ddp-workshop",
    workdir: str | os.PathLike | None = None,
) -> list[str]:
    """``ssh HOST '[cd WORKDIR &&] torchrun ...'`` for each host: one terminal per machine.

    The job starts when all of them have connected; the remote command is exactly
    :func:`host_commands`'s. ssh runs it in a shell that activates nothing, so each host's
    ``PATH`` must lead to the Python environment's ``torchrun`` (or type the command in a
    terminal on each machine, with the environment activated).
    """
    commands = host_commands(script, hosts=hosts, nproc_per_node=nproc_per_node, port=port,
                             args=args, max_restarts=max_restarts, rdzv_id=rdzv_id)
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


def job_port(rdzv_id: str) -> int:
    """A rendezvous port from the job's name and the user's id, as the batch scripts take theirs
    from the job's number: two people's jobs whose first host is the same machine never meet at
    one store (two jobs of one person need two names). Below the ports Linux gives outgoing
    connections (32768 and up)."""
    return 20000 + zlib.crc32(f"{os.getuid()}:{rdzv_id}".encode()) % 10000


def check_script(script) -> None:
    if not isinstance(script, (str, os.PathLike)) or not os.fspath(script).endswith(".py"):
        raise ValueError(f"script must be a Python file name like 'train_ddp.py', got {script!r}")
    if re.search(r"\s", os.fspath(script)):
        raise ValueError(f"script must not contain spaces (job files split on them), "
                         f"got {script!r}")


def check_dataset(dataset: str | None) -> None:
    """A job file's data set: the real CIFAR-10 (an error if missing), the stand-in, or either."""
    if dataset not in ("cifar10", "synthetic", None):
        raise ValueError(f"dataset must be 'cifar10', 'synthetic' or None, got {dataset!r}")


def check_words(**values: str | os.PathLike | None) -> None:
    """Each value (if given) is one word: a job file's directives and commands split on spaces."""
    for name, value in values.items():
        if value is not None and (not isinstance(value, (str, os.PathLike))
                                  or not os.fspath(value) or re.search(r"\s", os.fspath(value))):
            raise ValueError(f"{name} must be a non-empty string without spaces, got {value!r}")


def nproc_for(nproc_per_node: int | None, gpus_per_node: int) -> int:
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
