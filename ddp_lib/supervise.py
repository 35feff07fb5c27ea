"""Run torchrun agents as children of the notebook's kernel, relay their output, leave nothing.

torchrun starts each worker in a session of its own, so killing the agent's process group would
orphan the workers: the agent is asked to stop first (SIGTERM, it then stops its workers), and
only after a grace period is every process the launch ever started killed. The agent also gets
SIGTERM if the kernel dies (Linux parent-death signal). Each line an agent relays is labelled
with the rank that printed it (torchrun's ``[rankN]: `` prefix) and the agent (node) it came
through.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import psutil

from ddp_lib import torchrun

AGENT = "torchrun"
STOP_GRACE_S = 10.0


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
class Outcome:
    """What the agents left: their lines in order of arrival, exit status, time."""

    lines: list[Line] = field(default_factory=list)
    returncode: int | None = None
    timed_out: bool = False
    wall_time: float = 0.0


@dataclass
class Agent:
    """One torchrun agent to start: its command, environment and (optionally) its CPU cores."""

    command: list[str]
    env: dict[str, str]
    cores: list[int] = field(default_factory=list)


def run(agents: list[Agent], *, timeout: float, stream: bool, name: str) -> Outcome:
    """Start the agents, relay their lines until all are done, and leave no process behind.

    If one agent fails while others still run (a node whose workers crashed), the others are
    stopped at once: their workers would otherwise wait for the lost ranks until the timeout.

    Args:
        agents: the torchrun agents to start, one per (simulated) node.
        timeout: seconds before every process is stopped and ``Outcome.timed_out`` set.
        stream: print each line into the cell as it arrives.
        name: the script's name, for the messages of an interrupted launch.
    """
    multi = len(agents) > 1
    outcome = Outcome()
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
                if not outcome.timed_out and time.monotonic() - start > timeout:
                    outcome.timed_out = True
                    _stop_all(procs, watchers)
                elif multi and any(p.poll() not in (None, 0) for p in procs):
                    _stop_all(procs, watchers)
                continue
            if item is None:
                open_streams -= 1
                continue
            line = parse(*item)
            outcome.lines.append(line)
            echo(line)
        for proc in procs:
            proc.wait()
    except KeyboardInterrupt:
        _stop_all(procs, watchers)
        raise KeyboardInterrupt(f"Launch of {name} interrupted: torchrun and all "
                                "its workers were stopped.") from None
    except BaseException as exc:
        _stop_all(procs, watchers)
        print(f"\nLaunch of {name} ended by {exc!r}: torchrun and all its workers "
              "were stopped.", file=sys.stderr, flush=True)
        raise
    finally:
        for watcher in watchers:
            watcher.kill_leftovers()
    outcome.wall_time = time.monotonic() - start
    codes = [proc.returncode for proc in procs]
    outcome.returncode = next((code for code in codes if code != 0), 0)
    return outcome


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


def parse(stream: str, text: str, node: int = 0) -> Line:
    match = torchrun.RANK_PREFIX.match(text)
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
