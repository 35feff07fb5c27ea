"""Run a training script under ``torchrun`` (or MPICH's ``mpiexec``) from the notebook kernel.

Every launch runs the command a user types on a cluster; what only the notebook needs goes in its
environment. (``--standalone`` takes a port the system picks, so two launches cannot collide.)
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from ddp_lib import hardware
from ddp_lib.launching import messages, metrics, output, records, stacks, supervise, torchrun
from ddp_lib.launching.result import LaunchError, LaunchResult, LaunchTimeout, RankFailed, digest
from ddp_lib.launching.supervise import Agent

__all__ = ["launch", "launch_nodes"]

LAUNCHERS = ("torchrun", "mpiexec")

_run_counter = 0


def launch(script: str | os.PathLike, *, args: Sequence[str | int | float] = (),
           nproc_per_node: int | None = None, nnodes: int = 1, rdzv_endpoint: str | None = None,
           local_addr: str | None = None, backend: str | None = None,
           env: Mapping[str, str] | None = None, timeout: float = 600.0, max_restarts: int = 0,
           run_dir: str | os.PathLike | None = None, stream: bool = True, check: bool = True,
           launcher: Literal["torchrun", "mpiexec"] = "torchrun") -> LaunchResult:
    """Run ``script`` with ``torchrun`` and wait for it, showing each rank's output live.

    Args:
        script: the Python file to run.
        args: command-line arguments for the script.
        nproc_per_node: processes on this machine; ``None``: one per GPU, else 2 on the CPU.
        nnodes: number of machines (torchrun agents) taking part.
        rdzv_endpoint: ``host:port`` of the rendezvous, needed when ``nnodes > 1``.
        local_addr: the address this node advertises to the others (``None``: its host name).
        backend: ``"gloo"`` or ``"nccl"`` to force one (``DDP_BACKEND``); ``None``: the script's.
        env: extra environment variables for the workers (a PYTHONPATH goes after ddp_lib's).
        timeout: seconds before everything is stopped and :class:`LaunchTimeout` is raised.
        max_restarts: how often torchrun may restart the workers after a failure.
        run_dir: where logs and metrics go; by default a new folder under ``runs/``.
        stream: print the output live (``False``: show a progress bar).
        check: raise on failure; ``False`` returns the result with its non-zero returncode.
        launcher: ``"torchrun"`` or ``"mpiexec"`` (one machine; no nnodes, endpoint or restarts).

    Raises:
        ValueError, FileNotFoundError: bad arguments, before anything is started.
        RankFailed: a worker failed (``check=True``).
        LaunchTimeout: the run took longer than ``timeout``.
        LaunchInterrupted: the cell was interrupted during the run; every process was stopped.
    """
    script = Path(script)
    plan = _check_arguments(script, nproc_per_node, nnodes, rdzv_endpoint, backend,
                            timeout, max_restarts, env)
    if launcher == "mpiexec":
        given = {"nnodes": nnodes != 1, "rdzv_endpoint": rdzv_endpoint is not None,
                 "local_addr": local_addr is not None, "max_restarts": max_restarts != 0}
        if any(given.values()):
            named = ", ".join(name for name, set_ in given.items() if set_)
            raise ValueError(f"launcher='mpiexec' takes no {named}: those are torchrun's "
                             "(mpiexec here runs on one machine, with no rendezvous or restarts).")
    elif launcher != "torchrun":
        raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
    run_dir, metrics_file = _prepare_run_dir(script, run_dir)

    child_env = _child_env(env, plan, metrics_file, max_restarts)
    if launcher == "mpiexec":
        agent = _mpiexec(script, args, plan.nproc_per_node, run_dir, child_env)
    else:
        agent = _agent(script, args, plan.nproc_per_node, nnodes, rdzv_endpoint, local_addr,
                       max_restarts, run_dir, "torchrun", child_env)
    return _run(script, [agent], run_dir, metrics_file, timeout, stream, check)


def launch_nodes(script: str | os.PathLike, *, nnodes: int = 2,
                 args: Sequence[str | int | float] = (), nproc_per_node: int = 1,
                 backend: str | None = None, env: Mapping[str, str] | None = None,
                 timeout: float = 600.0, max_restarts: int = 0,
                 run_dir: str | os.PathLike | None = None, stream: bool = True,
                 check: bool = True) -> LaunchResult:
    """Run ``script`` as a job of ``nnodes`` machines, simulated on this one, and wait for it.

    Each node is a torchrun agent with its own CPU cores (and GPUs); ``command`` is node 0's.

    Args:
        nnodes: how many machines to simulate.
        nproc_per_node: processes on each node.
        backend: as for :func:`launch`; ``None``: NCCL when every process can have a GPU.
        script, args, env, timeout, max_restarts, run_dir, stream, check: as for :func:`launch`.
    """
    script = Path(script)
    if not isinstance(nnodes, int) or isinstance(nnodes, bool) or nnodes < 2:
        raise ValueError(f"launch_nodes needs nnodes >= 2, got {nnodes!r}; use launch() for one.")
    total = nproc_per_node * nnodes if isinstance(nproc_per_node, int) else nproc_per_node
    plan = _check_arguments(script, total, 1, None, backend, timeout, max_restarts, env)
    run_dir, metrics_file = _prepare_run_dir(script, run_dir)
    endpoint = f"127.0.0.1:{free_ports()[0]}"
    base_env = _child_env(env, plan, metrics_file, max_restarts)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    agents = []
    for node in range(nnodes):
        node_env = dict(base_env)
        if plan.backend == "nccl":
            gpus = range(node * nproc_per_node, (node + 1) * nproc_per_node)
            node_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        agents.append(_agent(script, args, nproc_per_node, nnodes, endpoint, "127.0.0.1",
                             max_restarts, run_dir, f"torchrun-node{node}", node_env,
                             _share(cores, node, nnodes)))
    return _run(script, agents, run_dir, metrics_file, timeout, stream, check)


def _agent(script: Path, args: Sequence, nproc_per_node: int, nnodes: int,
           rdzv_endpoint: str | None, local_addr: str | None, max_restarts: int, run_dir: Path,
           logs: str, env: dict[str, str], cores: list[int] | None = None) -> Agent:
    """One torchrun agent: the command a person types, with the notebook's settings in env."""
    words = torchrun.arguments(script, nproc_per_node=nproc_per_node, nnodes=nnodes,
                               rdzv_endpoint=rdzv_endpoint, rdzv_id=_rdzv_id(script),
                               local_addr=local_addr, max_restarts=max_restarts, args=args)
    # torchrun's own main, which also keeps each rank's failure as data (torchrun_main)
    recorded = {records.ENV_VAR: str(records.path(run_dir, logs))}
    return Agent(command=[sys.executable, "-m", "ddp_lib.launching.torchrun_main", *words],
                 env={**env, **torchrun.supervision(run_dir / logs), **recorded},
                 cores=cores or [], typed=["torchrun", *words])


# mpiexec labels each piece of a rank's output as torchrun labels its lines (Hydra's option).
MPIEXEC_RANK_LABEL = "[rank%r]: "


def _mpiexec(script: Path, args: Sequence, nproc: int, run_dir: Path, env: dict[str, str]) -> Agent:
    """MPICH's ``mpiexec -n N python script.py``; a free ``MASTER_PORT`` avoids collisions."""
    mpiexec = mpiexec_program()
    env = {**env, "MASTER_ADDR": env.get("MASTER_ADDR", "127.0.0.1"),
           "MASTER_PORT": env.get("MASTER_PORT", str(free_ports()[0]))}
    # Each rank line-buffers its output instead (worker_site): mpiexec labels every piece it reads.
    env.pop("PYTHONUNBUFFERED", None)
    words = [str(script), *torchrun.script_args(args)]
    return Agent(command=[mpiexec, "-n", str(nproc), "-prepend-pattern", MPIEXEC_RANK_LABEL,
                          sys.executable, *words],
                 env=env, typed=["mpiexec", "-n", str(nproc), "python", *words],
                 workers_below=2)


def mpiexec_program() -> str:
    """MPICH's mpiexec: the one installed beside this Python (the course's), else on the PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.is_file() else shutil.which("mpiexec")
    if not found:
        raise FileNotFoundError("No mpiexec here. The course's set-up installs MPICH's "
                                "(`pip install mpich`, in requirements.txt).")
    return found


def _rdzv_id(script: Path) -> str:
    """The script's name as the job's rendezvous id, shared by the agents of one launch."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", script.stem)


def _run(script: Path, agents: list[Agent], run_dir: Path, metrics_file: Path, timeout: float,
         stream: bool, check: bool) -> LaunchResult:
    script_digest = digest(script)  # before the start: the text these workers run
    if stream:
        for node, agent in enumerate(agents):
            where = f"# node {node}: " if len(agents) > 1 else ""
            print(f"{where}$ {_shown(agent)}", flush=True)
    outcome = supervise.run(agents, timeout=timeout, stream=stream, script=script,
                            stacks_dir=Path(agents[0].env[stacks.ENV_VAR]),
                            log=run_dir / "output.log")
    if agents[0].name == "mpiexec":  # what MPICH says failed, as torchrun's agent keeps it
        records.record_mpiexec(
            records.path(run_dir, agents[0].name),
            [line.text for line in outcome.lines if line.rank is None],
            sorted({line.rank for line in outcome.lines
                    if line.rank is not None and line.text.startswith(messages.CRASH)}))
    result = LaunchResult(script=script, command=agents[0].typed, run_dir=run_dir,
                          returncode=outcome.returncode, wall_time=outcome.wall_time,
                          lines=outcome.lines, metrics=metrics.read(metrics_file),
                          timed_out=outcome.timed_out, stacks=outcome.stacks,
                          stopped_at=outcome.stopped_at, restarted_at=outcome.restarted_at,
                          script_digest=script_digest, failure_report=records.read(run_dir))
    if result.timed_out:
        raise LaunchTimeout(messages.timeout_message(result, timeout), result)
    if result.returncode != 0 and check:
        complaint = result.failure_report.refused  # torchrun refused its command line
        if complaint:
            raise LaunchError(messages.refusal_message(result, complaint), result)
        rank, exitcode = messages.root_cause(result)
        if outcome.failed_bar is not None and rank is not None:
            said = messages.last_error(result, rank)[:60] or f"exit code {exitcode}"
            output.mark_failed(outcome.failed_bar, f"rank {rank} failed: {said}")
        raise RankFailed(messages.failure_message(result, rank, exitcode), result, rank, exitcode)
    return result


# Set for the notebook alone; any other variable the launch sets changes what a rank does, so it
# is printed before the command (OMP_NUM_THREADS too, where the launcher would not set it itself).
NOTEBOOK_ONLY_ENV = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED", metrics.ENV_VAR, stacks.ENV_VAR,
                               records.ENV_VAR,
                               *torchrun.supervision(Path())})


def _shown(agent: Agent) -> str:
    """The agent's command as a person types it, after the variables that change what it does."""
    own = agent.typed[0] == "torchrun" and "--nproc-per-node=1" not in agent.typed  # sets it
    settings = "".join(f"{k}={shlex.quote(v)} " for k, v in sorted(agent.env.items())
                       if k not in NOTEBOOK_ONLY_ENV and os.environ.get(k) != v
                       and not (own and k == "OMP_NUM_THREADS" and v == "1"))
    return f"{settings}{shlex.join(agent.typed)}"


def free_ports(count: int = 1) -> list[int]:
    """Distinct free ports; another process must know the port in advance, so ``:0`` won't do."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _share(cores: list[int], node: int, nnodes: int) -> list[int]:
    """Node ``node``'s slice of the cores, as if it were a machine of its own (all if too few)."""
    if len(cores) < nnodes:
        return cores
    per_node = len(cores) // nnodes
    return cores[node * per_node:(node + 1) * per_node]


def _check_arguments(script: Path, nproc_per_node, nnodes, rdzv_endpoint, backend, timeout,
                     max_restarts, env) -> hardware.Plan:
    if not script.is_file():
        raise FileNotFoundError(f"No script at {script.resolve()}. Write it first "
                                "(ddp_lib.write_script or the %%write_script cell magic).")
    plan = hardware.plan(nproc_per_node, backend)
    torchrun.check_int("nnodes", nnodes, low=1)
    torchrun.check_int("max_restarts", max_restarts, low=0)
    if nnodes > 1 and not rdzv_endpoint:
        raise ValueError("With nnodes > 1 every node must be given the same rdzv_endpoint "
                         "('host:port' of node 0, reachable from all nodes).")
    if rdzv_endpoint is not None:
        torchrun.check_endpoint(rdzv_endpoint)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"env must map strings to strings; {key!r}: {value!r} is not")
    return plan


def _prepare_run_dir(script: Path, run_dir: str | os.PathLike | None) -> tuple[Path, Path]:
    """The launch's folder and metrics file, with an earlier launch's logs and metrics removed."""
    run_dir = _new_run_dir(script) if run_dir is None else Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for logs in [*run_dir.glob("torchrun*"), run_dir / "mpiexec"]:
        shutil.rmtree(logs, ignore_errors=True)
    metrics_file = run_dir / "metrics.jsonl"
    metrics_file.unlink(missing_ok=True)
    return run_dir, metrics_file


def _new_run_dir(script: Path) -> Path:
    global _run_counter
    _run_counter += 1
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{script.stem}-{stamp}-{os.getpid()}-{_run_counter}"


def _child_env(extra: Mapping[str, str] | None, plan: hardware.Plan, metrics_file: Path,
               max_restarts: int) -> dict[str, str]:
    env = dict(os.environ)
    worker_site = Path(__file__).resolve().parent / "worker_site"
    root = worker_site.parents[2]  # the folder that holds ddp_lib and course_helpers.py
    extra = dict(extra or {})
    env["PYTHONPATH"] = os.pathsep.join(  # workers get this ddp_lib and worker_site's sitecustomize
        p for p in (str(worker_site), str(root), extra.pop("PYTHONPATH", None),
                    env.get("PYTHONPATH")) if p)
    env[stacks.ENV_VAR] = str(metrics_file.parent / "stacks")
    env["PYTHONUNBUFFERED"] = "1"  # output reaches the cell line by line, not at exit
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun: for 2+ processes (warning); else printed
    env[metrics.ENV_VAR] = str(metrics_file)
    env.update(plan.env())  # DDP_BACKEND where the scripts' own rule would choose otherwise
    env.update(torchrun.restart_env(max_restarts))  # see there; shown in the printed command
    env.update(extra)
    return env
