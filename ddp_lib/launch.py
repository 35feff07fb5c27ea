"""Run a training script under ``torchrun`` as a subprocess of the notebook kernel.

Every distributed run in the course is a real ``torchrun`` launch, the same command a user types
on a cluster; this module only does the plumbing around it:

* it checks the arguments before anything starts, and says how to fix them;
* it lets the rendezvous pick a free port on the loopback address, so two launches at once
  (from two notebooks) cannot collide;
* it streams every rank's output into the cell as it is printed, each line prefixed with its rank
  (torchrun's own ``--tee`` with a rank prefix, so the same command shows the same thing in a
  terminal);
* it returns a :class:`LaunchResult` (exit status, wall time, per-rank output, reported metrics);
* when a rank fails it raises :class:`RankFailed` naming the rank, with that rank's traceback;
  a timeout raises :class:`LaunchTimeout`; an interrupted cell stops everything and re-raises;
* no process outlives its launch. torchrun starts each worker in a session of its own, so killing
  the agent's process group would orphan the workers: the agent is asked to stop first (SIGTERM,
  it then stops its workers), and only after a grace period is every process the launch ever
  started killed. The agent also gets SIGTERM if the kernel dies (Linux parent-death signal).
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ddp_lib import hardware, metrics

RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?")
AGENT = "torchrun"
STOP_GRACE_S = 10.0
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
    """One line of output: who printed it (``"rank0"``, ``"torchrun"``), on which stream."""

    source: str
    stream: str
    text: str


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
        found = {int(line.source[4:]) for line in self.lines if line.source.startswith("rank")}
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
    run_dir = _new_run_dir(script) if run_dir is None else Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = run_dir / "metrics.jsonl"
    metrics_file.unlink(missing_ok=True)

    if nnodes == 1:
        rdzv_endpoint = rdzv_endpoint or "127.0.0.1:0"
        local_addr = local_addr or "127.0.0.1"
    command = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={plan.nproc_per_node}",
        f"--node-rank={node_rank}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        *([f"--local-addr={local_addr}"] if local_addr else []),
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.1",
        f"--log-dir={run_dir / 'torchrun'}",
        "--tee=3",
        "--log-line-prefix-template=[rank${rank}]: ",
        str(script),
        *(str(a) for a in args),
    ]
    child_env = _child_env(env, backend, metrics_file)
    result = LaunchResult(script=script, command=command, run_dir=run_dir)
    if stream:
        print(f"$ torchrun {shlex.join(command[3:])}", flush=True)

    start = time.monotonic()
    proc = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=child_env, start_new_session=True, preexec_fn=_stop_with_parent(),
    )
    watcher = _ProcessWatcher(proc.pid)
    lines: queue.Queue = queue.Queue()
    readers = [threading.Thread(target=_read_lines, args=(pipe, name, lines), daemon=True)
               for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
    for reader in readers:
        reader.start()

    timed_out = False
    echo = _Echo(stream)
    try:
        open_streams = len(readers)
        while open_streams:
            try:
                item = lines.get(timeout=0.1)
            except queue.Empty:
                watcher.refresh()
                if not timed_out and time.monotonic() - start > timeout:
                    timed_out = True
                    _stop(proc, watcher)
                continue
            if item is None:
                open_streams -= 1
                continue
            line = _parse(*item)
            result.lines.append(line)
            echo(line)
        proc.wait()
    except KeyboardInterrupt:
        _stop(proc, watcher)
        raise KeyboardInterrupt(f"Launch of {script.name} interrupted: torchrun and all its "
                                "workers were stopped.") from None
    except BaseException as exc:
        _stop(proc, watcher)
        print(f"\nLaunch of {script.name} ended by {exc!r}: torchrun and all its workers were "
              "stopped.", file=sys.stderr, flush=True)
        raise
    finally:
        watcher.kill_leftovers()

    result.returncode = proc.returncode
    result.wall_time = time.monotonic() - start
    result.metrics = metrics.read(metrics_file)
    if timed_out:
        raise LaunchTimeout(_timeout_message(result, timeout), result)
    if result.returncode != 0 and check:
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
    env.update(extra or {})
    return env


def _stop_with_parent():
    """A ``preexec_fn`` that makes Linux send SIGTERM to torchrun if the kernel dies."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    parent = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)

    def set_parent_death_signal() -> None:
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return set_parent_death_signal


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


def _stop(proc: subprocess.Popen, watcher: _ProcessWatcher) -> None:
    """SIGTERM to torchrun (it stops its workers), then SIGKILL to whatever is left."""
    watcher.refresh()
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            pass
    watcher.kill_leftovers()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _read_lines(pipe, stream: str, out: queue.Queue) -> None:
    with pipe:
        for raw in iter(pipe.readline, b""):
            out.put((stream, raw.decode("utf-8", errors="replace").rstrip("\r\n")))
    out.put(None)


def _parse(stream: str, text: str) -> Line:
    match = RANK_PREFIX.match(text)
    if not match:
        return Line(AGENT, stream, text)
    rank = match.group(1)
    text = text[match.end():]
    # PyTorch prefixes uncaught exceptions in workers with the rank itself: drop the repeat.
    repeat = f"[rank{rank}]: "
    if text.startswith(repeat):
        text = text[len(repeat):]
    return Line(f"rank{rank}", stream, text)


class _Echo:
    """Prints lines into the cell, one write per line so ranks never interleave mid-line.

    torchrun's own Python traceback after a failed worker is kept in the result but not shown:
    the error raised by ``launch`` says what failed, and it is shorter.
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.agent_traceback = False

    def __call__(self, line: Line) -> None:
        if line.source == AGENT and line.text.startswith("Traceback (most recent call last)"):
            self.agent_traceback = True
        if not self.enabled or (line.source == AGENT and self.agent_traceback):
            return
        target = sys.stderr if line.stream == "stderr" else sys.stdout
        target.write(f"[{line.source}] {line.text}\n")
        target.flush()


_ROOT_CAUSE = re.compile(
    r"Root Cause.*?rank\s*:\s*(-?\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)


def _root_cause(result: LaunchResult) -> tuple[int | None, int | None]:
    """The first rank that failed and its exit code, from torchrun's failure report."""
    match = _ROOT_CAUSE.search(result.output(AGENT))
    if not match:
        return None, result.returncode
    return int(match.group(1)), int(match.group(2))


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
