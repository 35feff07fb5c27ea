"""Run a training script under ``torchrun`` as a subprocess of the notebook kernel.

Every distributed run in the course is a real ``torchrun`` launch, the same command a user types
on a cluster; this module only does the plumbing around it:

* it checks the arguments before anything starts, and says how to fix them;
* it lets the rendezvous pick a free port on the loopback address, so two launches at once
  (from two notebooks) cannot collide;
* it streams every rank's output into the cell as it is printed, each line prefixed with its rank
  (torchrun's own ``--tee`` with a rank prefix, so the same command shows the same thing in a
  terminal). Which torchrun options it uses is read from the installed torchrun itself, not from
  its version: the course runs on the torch a cluster ships, often a year or more old;
* it returns a :class:`LaunchResult` (exit status, wall time, per-rank output, reported metrics);
* :func:`launch_nodes` runs one job as several torchrun agents on this machine, each a
  simulated node with its own cores (and GPUs), to show a multi-node launch from a notebook;
* when a rank fails it raises :class:`RankFailed` naming the rank, with that rank's traceback;
  a timeout raises :class:`LaunchTimeout`; an interrupted cell stops everything and re-raises;
* no process outlives its launch. torchrun starts each worker in a session of its own, so killing
  the agent's process group would orphan the workers: the agent is asked to stop first (SIGTERM,
  it then stops its workers), and only after a grace period is every process the launch ever
  started killed. The agent also gets SIGTERM if the kernel dies (Linux parent-death signal).
"""

from __future__ import annotations

import functools
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ddp_lib import hardware, metrics

RANK_LABEL = "[rank${rank}]: "  # torchrun fills in the global rank
RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?")
# The label is a command-line option only in recent torchrun; every torchrun of the supported
# range reads it from this variable, which the option merely overrides.
RANK_LABEL_OPTION = "--log-line-prefix-template"
RANK_LABEL_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
AGENT = "torchrun"
STOP_GRACE_S = 10.0
# By default torchrun lets its workers share its rendezvous store. After a restart that store
# still holds the failed attempt's addresses, and a worker that reads one before its peer has
# replaced it dials a dead process (pytorch/pytorch#135712). So every launch gives the workers
# their own store.
OWN_STORE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
_run_counter = 0


class LaunchError(RuntimeError):
    """A launch that did not end well; ``result`` holds everything that was collected."""

    def __init__(self, message: str, result: LaunchResult):
        super().__init__(message)
        self.result = result


class RankFailed(LaunchError):
    """A worker exited with an error; ``rank`` and ``exitcode`` say which and how."""

    def __init__(self, message: str, result: LaunchResult, rank: int | None, exitcode: int | None):
        super().__init__(message, result)
        self.rank = rank
        self.exitcode = exitcode


class LaunchTimeout(LaunchError):
    """The launch ran past its ``timeout`` and was stopped."""


@dataclass
class Line:
    """One line of output: who printed it (``"rank0"``, ``"torchrun"``), on which stream.

    ``node`` tells which torchrun agent the line came through (always 0 on one node); rank
    numbers are global, so ``"rank3"`` is the same process whichever node it runs on.
    """

    source: str
    stream: str
    text: str
    node: int = 0

    @property
    def rank(self) -> int | None:
        """The global rank that printed the line; ``None`` for torchrun's own lines."""
        return int(self.source[4:]) if self.source.startswith("rank") else None


@dataclass
class LaunchResult:
    """Everything a finished launch left behind, for the next cell to plot or assert on."""

    script: Path
    command: list[str]
    run_dir: Path
    returncode: int | None = None
    wall_time: float = 0.0
    lines: list[Line] = field(default_factory=list)
    metrics: list[dict] = field(default_factory=list)
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def output(self, rank: int | str | None = None, stream: str | None = None) -> str:
        """The text printed by one rank (an int), by ``"torchrun"``, or by all (``None``).

        Args:
            rank: which rank's lines; ``None`` for every line in the order they arrived.
            stream: ``"stdout"`` or ``"stderr"`` only; ``None`` for both.
        """
        source = f"rank{rank}" if isinstance(rank, int) else rank
        return "\n".join(
            line.text if source else f"[{line.source}] {line.text}"
            for line in self.lines
            if (source is None or line.source == source) and stream in (None, line.stream)
        )

    def metric(self, name: str, rank: int = 0) -> list[tuple[int | None, float]]:
        """``(step, value)`` pairs reported under ``name`` by ``rank``, in order."""
        return [(m["step"], m["value"]) for m in self.metrics
                if m["name"] == name and m["rank"] == rank]

    def ranks(self) -> list[int]:
        """The ranks that printed or reported anything."""
        found = {line.rank for line in self.lines if line.rank is not None}
        found.update(m["rank"] for m in self.metrics)
        return sorted(found)


def launch(
    script: str | os.PathLike,
    *,
    args: Sequence[str | int | float] = (),
    nproc_per_node: int | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    local_addr: str | None = None,
    backend: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
    max_restarts: int = 0,
    run_dir: str | os.PathLike | None = None,
    stream: bool = True,
    check: bool = True,
) -> LaunchResult:
    """Run ``script`` with ``torchrun`` and wait for it, showing each rank's output live.

    Args:
        script: the Python file to run (written by a notebook cell, or any script).
        args: command-line arguments for the script.
        nproc_per_node: processes on this machine; ``None``: one per GPU, else 2 on the CPU.
        nnodes: number of machines (torchrun agents) taking part.
        node_rank: this machine's index in ``[0, nnodes)``.
        rdzv_endpoint: ``host:port`` of the rendezvous; needed when ``nnodes > 1``. For one
            node the default is the loopback address with a port the system picks.
        local_addr: the address this node advertises to the others; ``127.0.0.1`` by default
            on one node.
        backend: ``"gloo"`` or ``"nccl"`` to force one (checked against the hardware, passed
            to the script as ``DDP_BACKEND``); ``None`` lets the script choose.
        env: extra environment variables for the workers.
        timeout: seconds before everything is stopped and :class:`LaunchTimeout` is raised.
        max_restarts: how often torchrun may restart the workers after a failure.
        run_dir: where torchrun's logs and the metrics file go; a new folder under ``runs/``
            by default.
        stream: print the output live (``False``: only collect it).
        check: raise on failure; ``False`` returns the result with its non-zero returncode.

    Returns:
        a :class:`LaunchResult`.

    Raises:
        ValueError, FileNotFoundError: bad arguments, before anything is started.
        RankFailed: a worker failed (``check=True``).
        LaunchTimeout: the run took longer than ``timeout``.
        KeyboardInterrupt: the cell was interrupted; every process was stopped first.
    """
    script = Path(script)
    plan = _check_arguments(script, nproc_per_node, nnodes, node_rank, rdzv_endpoint, backend,
                            timeout, max_restarts, env)
    run_dir, metrics_file = _prepare_run_dir(script, run_dir)

    if nnodes == 1:
        rdzv_endpoint = rdzv_endpoint or "127.0.0.1:0"
        local_addr = local_addr or "127.0.0.1"
    command = _torchrun_command(script, args, plan.nproc_per_node, nnodes, node_rank,
                                rdzv_endpoint, local_addr, max_restarts, run_dir / "torchrun")
    result = LaunchResult(script=script, command=command, run_dir=run_dir)
    env = _child_env(env, backend, metrics_file)
    _supervise(result, [_Agent(command, env)], timeout, stream)
    return _finish(result, metrics_file, timeout, check)


def launch_nodes(
    script: str | os.PathLike,
    *,
    nnodes: int = 2,
    args: Sequence[str | int | float] = (),
    nproc_per_node: int = 1,
    backend: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
    max_restarts: int = 0,
    run_dir: str | os.PathLike | None = None,
    stream: bool = True,
    check: bool = True,
) -> LaunchResult:
    """Run ``script`` as a job of ``nnodes`` machines, simulated on this one, and wait for it.

    Each "node" is a torchrun agent of its own, as on a cluster: ``--nnodes``, its own
    ``--node-rank``, and one rendezvous endpoint (``127.0.0.1`` and a free port, where node 0's
    agent hosts the store). Like a separate machine, each node gets its own share of the CPU
    cores (its processes are pinned to them) and, with NCCL, its own GPUs
    (``CUDA_VISIBLE_DEVICES``). The output of every rank of every node streams into the cell.

    Args:
        script: the Python file to run.
        nnodes: how many machines to simulate.
        args: command-line arguments for the script (the same on every node).
        nproc_per_node: processes on each node.
        backend: ``"gloo"`` or ``"nccl"`` to force one; ``None`` chooses NCCL when there is a
            GPU for every process of every node. Passed to the script as ``DDP_BACKEND``.
        env, timeout, max_restarts, run_dir, stream, check: as for :func:`launch`.

    Returns:
        a :class:`LaunchResult`; ``command`` is node 0's, and every line knows its node.
    """
    script = Path(script)
    if not isinstance(nnodes, int) or isinstance(nnodes, bool) or nnodes < 2:
        raise ValueError(f"launch_nodes needs nnodes >= 2, got {nnodes!r}; use launch() for one.")
    total = nproc_per_node * nnodes if isinstance(nproc_per_node, int) else nproc_per_node
    plan = _check_arguments(script, total, 1, 0, None, backend, timeout, max_restarts, env)
    run_dir, metrics_file = _prepare_run_dir(script, run_dir)

    endpoint = f"127.0.0.1:{_free_port()}"
    base_env = _child_env(env, plan.backend, metrics_file)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    agents = []
    for node in range(nnodes):
        command = _torchrun_command(script, args, nproc_per_node, nnodes, node, endpoint,
                                    "127.0.0.1", max_restarts, run_dir / f"torchrun-node{node}")
        node_env = dict(base_env)
        if plan.backend == "nccl":
            gpus = range(node * nproc_per_node, (node + 1) * nproc_per_node)
            node_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        agents.append(_Agent(command, node_env, _share(cores, node, nnodes)))
    result = LaunchResult(script=script, command=agents[0].command, run_dir=run_dir)
    _supervise(result, agents, timeout, stream)
    return _finish(result, metrics_file, timeout, check)


def torchrun_accepts(option: str) -> bool:
    """Whether the installed torchrun has ``option`` (e.g. ``"--log-line-prefix-template"``).

    Asked of torchrun's own argument parser, so the answer holds for whichever torch is installed
    (an option that a release added, renamed or removed), where a version check would guess.
    """
    return option.lstrip("-").replace("-", "_") in _torchrun_settings()


@functools.cache
def _torchrun_settings() -> frozenset[str]:
    """The names of every setting torchrun's parser fills in (one per option, plus the script)."""
    from torch.distributed.run import get_args_parser

    known, _ = get_args_parser().parse_known_args(["script.py"])
    return frozenset(vars(known))


def _rank_labelling() -> tuple[list[str], dict[str, str]]:
    """The torchrun options and environment that put ``[rankN]: `` before each worker line."""
    if torchrun_accepts(RANK_LABEL_OPTION):
        return [f"{RANK_LABEL_OPTION}={RANK_LABEL}"], {}
    return [], {RANK_LABEL_ENV: RANK_LABEL}


def _torchrun_command(script: Path, args: Sequence, nproc_per_node: int, nnodes: int,
                      node_rank: int, rdzv_endpoint: str, local_addr: str | None,
                      max_restarts: int, log_dir: Path) -> list[str]:
    label_options, _ = _rank_labelling()
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        f"--node-rank={node_rank}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        *([f"--local-addr={local_addr}"] if local_addr else []),
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.1",
        f"--log-dir={log_dir}",
        "--tee=3",
        *label_options,
        str(script),
        *(str(a) for a in args),
    ]


def _free_port() -> int:
    """A port that is free now. Another node must know it in advance, so ``:0`` cannot do."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _share(cores: list[int], node: int, nnodes: int) -> list[int]:
    """Node ``node``'s slice of the cores, as if it were a machine of its own (all if too few)."""
    if len(cores) < nnodes:
        return cores
    per_node = len(cores) // nnodes
    return cores[node * per_node:(node + 1) * per_node]


def _finish(result: LaunchResult, metrics_file: Path, timeout: float,
            check: bool) -> LaunchResult:
    result.metrics = metrics.read(metrics_file)
    if result.timed_out:
        raise LaunchTimeout(_timeout_message(result, timeout), result)
    if result.returncode != 0 and check:
        refusal = _refusal(result)
        if refusal:
            raise LaunchError(_refusal_message(result, refusal), result)
        rank, exitcode = _root_cause(result)
        raise RankFailed(_failure_message(result, rank, exitcode), result, rank, exitcode)
    return result


def _check_arguments(script: Path, nproc_per_node, nnodes, node_rank, rdzv_endpoint, backend,
                     timeout, max_restarts, env) -> hardware.Plan:
    if not script.is_file():
        raise FileNotFoundError(f"No script at {script.resolve()}. Write it first "
                                "(ddp_lib.write_script or the %%write_script cell magic).")
    plan = hardware.plan(nproc_per_node, backend)
    for name, value, low in (("nnodes", nnodes, 1), ("node_rank", node_rank, 0),
                             ("max_restarts", max_restarts, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if node_rank >= nnodes:
        raise ValueError(f"node_rank must be in [0, nnodes) = [0, {nnodes}), got {node_rank}. "
                         "Number the machines 0, 1, ..., nnodes-1.")
    if nnodes > 1 and not rdzv_endpoint:
        raise ValueError("With nnodes > 1 every node must be given the same rdzv_endpoint "
                         "('host:port' of node 0, reachable from all nodes).")
    if rdzv_endpoint is not None and not re.fullmatch(r"[^:\s]+:\d+|\[[0-9a-fA-F:]+\]:\d+",
                                                      rdzv_endpoint):
        raise ValueError(f"rdzv_endpoint must look like 'host:port', got {rdzv_endpoint!r}")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"env must map strings to strings; {key!r}: {value!r} is not")
    return plan


def _prepare_run_dir(script: Path, run_dir: str | os.PathLike | None) -> tuple[Path, Path]:
    """The launch's folder (created) and its metrics file (emptied: one launch's numbers)."""
    run_dir = _new_run_dir(script) if run_dir is None else Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = run_dir / "metrics.jsonl"
    metrics_file.unlink(missing_ok=True)
    return run_dir, metrics_file


def _new_run_dir(script: Path) -> Path:
    global _run_counter
    _run_counter += 1
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{script.stem}-{stamp}-{os.getpid()}-{_run_counter}"


def _child_env(extra: Mapping[str, str] | None, backend: str | None,
               metrics_file: Path) -> dict[str, str]:
    env = dict(os.environ)
    # Workers must import ddp_lib from the same place as this kernel does.
    here = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"  # output reaches the cell line by line, not at exit
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default, set here to skip its warning
    env[metrics.ENV_VAR] = str(metrics_file)
    if backend:
        env["DDP_BACKEND"] = backend
    env.update(OWN_STORE_ENV)  # see OWN_STORE_ENV; shown in the printed command
    env.update(_rank_labelling()[1])  # an older torchrun's way to the rank labels; shown too
    env.update(extra or {})
    return env


@dataclass
class _Agent:
    """One torchrun agent to start: its command, environment and (optionally) its CPU cores."""

    command: list[str]
    env: dict[str, str]
    cores: list[int] = field(default_factory=list)


def _supervise(result: LaunchResult, agents: list[_Agent], timeout: float, stream: bool) -> None:
    """Start the agents, relay their lines until all are done, and leave no process behind.

    If one agent fails while others still run (a node whose workers crashed), the others are
    stopped at once: their workers would otherwise wait for the lost ranks until the timeout.
    """
    multi = len(agents) > 1
    if stream:
        for node, agent in enumerate(agents):
            where = f"# node {node}: " if multi else ""
            settings = "".join(f"{k}={shlex.quote(agent.env[k])} "
                               for k in (*OWN_STORE_ENV, RANK_LABEL_ENV) if k in agent.env)
            print(f"{where}$ {settings}torchrun {shlex.join(agent.command[3:])}", flush=True)
    lines: queue.Queue = queue.Queue()
    procs: list[subprocess.Popen] = []
    watchers: list[_ProcessWatcher] = []
    echo = _Echo(stream, multi)
    start = time.monotonic()
    try:
        for node, agent in enumerate(agents):
            proc = subprocess.Popen(
                agent.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=agent.env, start_new_session=True,
                preexec_fn=_prepare_child(agent.cores),
            )
            procs.append(proc)
            watchers.append(_ProcessWatcher(proc.pid))
            for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
                threading.Thread(target=_read_lines, args=(pipe, name, node, lines),
                                 daemon=True).start()
        open_streams = 2 * len(procs)
        while open_streams:
            try:
                item = lines.get(timeout=0.1)
            except queue.Empty:
                for watcher in watchers:
                    watcher.refresh()
                if not result.timed_out and time.monotonic() - start > timeout:
                    result.timed_out = True
                    _stop_all(procs, watchers)
                elif multi and any(p.poll() not in (None, 0) for p in procs):
                    _stop_all(procs, watchers)
                continue
            if item is None:
                open_streams -= 1
                continue
            line = _parse(*item)
            result.lines.append(line)
            echo(line)
        for proc in procs:
            proc.wait()
    except KeyboardInterrupt:
        _stop_all(procs, watchers)
        raise KeyboardInterrupt(f"Launch of {result.script.name} interrupted: torchrun and all "
                                "its workers were stopped.") from None
    except BaseException as exc:
        _stop_all(procs, watchers)
        print(f"\nLaunch of {result.script.name} ended by {exc!r}: torchrun and all its workers "
              "were stopped.", file=sys.stderr, flush=True)
        raise
    finally:
        for watcher in watchers:
            watcher.kill_leftovers()
    result.wall_time = time.monotonic() - start
    codes = [proc.returncode for proc in procs]
    result.returncode = next((code for code in codes if code != 0), 0)


def _prepare_child(cores: list[int]):
    """A ``preexec_fn`` for an agent: pin it to ``cores`` (when given) and, on Linux, have the
    kernel send it SIGTERM if this process (the notebook's kernel) dies."""
    parent = os.getpid()
    linux = sys.platform.startswith("linux")
    libc = None
    if linux:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)

    def prepare() -> None:
        if cores:
            os.sched_setaffinity(0, cores)
        if libc is not None:
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died before prctl took effect
                os.kill(os.getpid(), signal.SIGTERM)

    return prepare


class _ProcessWatcher:
    """Remembers every process the launch started, even after torchrun is gone.

    Workers live in sessions of their own and are re-parented when the agent dies, so the tree
    is read while it is intact, and anything still alive at the end is killed.
    """

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self.seen: dict[int, psutil.Process] = {pid: self.root}

    def refresh(self) -> None:
        try:
            for child in self.root.children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.Error:
            pass

    def alive(self) -> list[psutil.Process]:
        return [p for p in self.seen.values() if _running(p)]

    def kill_leftovers(self) -> None:
        self.refresh()
        leftovers = self.alive()
        for p in leftovers:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(leftovers, timeout=5)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _stop_all(procs: list[subprocess.Popen], watchers: list[_ProcessWatcher]) -> None:
    """SIGTERM to every torchrun (each stops its workers), then SIGKILL to whatever is left."""
    for watcher in watchers:
        watcher.refresh()
    for proc in procs:
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for watcher in watchers:
        watcher.kill_leftovers()
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _read_lines(pipe, stream: str, node: int, out: queue.Queue) -> None:
    with pipe:
        for raw in iter(pipe.readline, b""):
            out.put((stream, raw.decode("utf-8", errors="replace").rstrip("\r\n"), node))
    out.put(None)


def _parse(stream: str, text: str, node: int = 0) -> Line:
    match = RANK_PREFIX.match(text)
    if not match:
        return Line(AGENT, stream, text, node)
    rank = match.group(1)
    text = text[match.end():]
    # PyTorch prefixes uncaught exceptions in workers with the rank itself: drop the repeat.
    repeat = f"[rank{rank}]: "
    if text.startswith(repeat):
        text = text[len(repeat):]
    return Line(f"rank{rank}", stream, text, node)


class _Echo:
    """Prints lines into the cell, one write per line so ranks never interleave mid-line.

    torchrun's own Python traceback after a failed worker is kept in the result but not shown:
    the error raised by ``launch`` says what failed, and it is shorter.
    """

    def __init__(self, enabled: bool, multi_node: bool = False):
        self.enabled = enabled
        self.multi_node = multi_node
        self.agent_traceback: set[int] = set()

    def __call__(self, line: Line) -> None:
        agent = line.source == AGENT
        if agent and line.text.startswith("Traceback (most recent call last)"):
            self.agent_traceback.add(line.node)
        if not self.enabled or (agent and line.node in self.agent_traceback):
            return
        source = f"{line.source} node{line.node}" if agent and self.multi_node else line.source
        target = sys.stderr if line.stream == "stderr" else sys.stdout
        target.write(f"[{source}] {line.text}\n")
        target.flush()


_ROOT_CAUSE = re.compile(
    r"Root Cause.*?rank\s*:\s*(-?\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)


def _root_cause(result: LaunchResult) -> tuple[int | None, int | None]:
    """The first rank that failed and its exit code, from torchrun's failure report."""
    match = _ROOT_CAUSE.search(result.output(AGENT))
    if not match:
        return None, result.returncode
    return int(match.group(1)), int(match.group(2))


_PARSER_ERROR = re.compile(r"^\S+: error: (.+)$", re.MULTILINE)


def _refusal(result: LaunchResult) -> str | None:
    """torchrun's own complaint about its command line, if that is why no worker ran."""
    if result.ranks():
        return None
    match = _PARSER_ERROR.search(result.output(AGENT, stream="stderr"))
    return match.group(1) if match else None


def _refusal_message(result: LaunchResult, refusal: str) -> str:
    import torch

    return (f"torchrun refused its command line, so no worker ran: {refusal}\n"
            f"The command: torchrun {shlex.join(result.command[3:])}\n"
            f"The installed torchrun is torch {torch.__version__}'s; `torchrun --help` lists "
            "what it accepts.")


def _traceback(text: str) -> str:
    start = text.rfind("Traceback (most recent call last)")
    return text[start:] if start >= 0 else ""


def _exit_description(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (out of memory, or killed by hand?)" if name == "SIGKILL" else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {exitcode}"


def _failure_message(result: LaunchResult, rank: int | None, exitcode: int | None) -> str:
    who = f"Rank {rank}" if rank is not None else "torchrun"
    text = result.output(rank if rank is not None else AGENT, stream="stderr")
    tb = _traceback(text) or "\n".join(text.splitlines()[-15:])
    parts = [f"{who} {_exit_description(exitcode)} while running {result.script.name} "
             f"(launch ended after {result.wall_time:.1f} s)."]
    if tb:
        parts.append(f"Its error output:\n{_indent(tb)}")
    parts.append(f"All output: result.output(); torchrun's logs: {result.run_dir / 'torchrun'}")
    return "\n".join(parts)


def _timeout_message(result: LaunchResult, timeout: float) -> str:
    parts = [f"{result.script.name} did not finish within timeout={timeout:g} s; torchrun and "
             "all its workers were stopped."]
    ranks = result.ranks()
    if not ranks:
        parts.append("No rank printed anything: did every process reach the rendezvous "
                     "(all nodes started, the endpoint reachable)?")
    for rank in ranks:
        tail = result.output(rank).splitlines()[-3:]
        if tail:
            parts.append(f"Last lines of rank {rank}:\n{_indent(chr(10).join(tail))}")
    return "\n".join(parts)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
