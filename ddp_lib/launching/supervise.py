"""Run a launcher (torchrun agents, or mpiexec) under the kernel, relay its output, leave nothing.

torchrun starts each worker in a session of its own, so killing the agent's process group would
orphan them: the agent gets SIGTERM (and stops its workers), and only after a grace period is
every process the launch started killed. mpiexec does not stop the other ranks when one raises
(they would wait in their next collective until the timeout), so the launch does, a moment after
a rank printed its uncaught exception.
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
from pathlib import Path

import psutil

from ddp_lib.launching import stacks
from ddp_lib.launching.messages import CRASH, TRACEBACK
from ddp_lib.launching.output import Echo, parse, read_lines
from ddp_lib.launching.result import LaunchInterrupted, Line

STOP_GRACE_S = 10.0
STACKS_WAIT_S = 3.0  # how long the workers get to write their stacks before they are stopped
RANK_ERROR_GRACE_S = 2.0  # after an mpiexec rank raised: time for the others to print theirs


@dataclass
class Outcome:
    """What the agents left: their lines in order of arrival, exit status, time."""

    lines: list[Line] = field(default_factory=list)
    returncode: int | None = None
    stopped_at: float | None = None  # the ``time.time()`` the launch stopped a failing launch
    restarted_at: float | None = None  # when torchrun last started the workers anew
    timed_out: bool = False
    wall_time: float = 0.0
    stacks: dict[int, str] = field(default_factory=dict)  # rank -> its threads' stacks
    failed_bar: object = None  # the red progress bar of a failed launch, to name the rank on


@dataclass
class Agent:
    """One launcher process to start: a torchrun agent (one per node), or mpiexec."""

    command: list[str]
    env: dict[str, str]
    cores: list[int] = field(default_factory=list)
    typed: list[str] = field(default_factory=list)  # the command as a person types it
    workers_below: int = 1  # how deep the ranks are in the process tree

    @property
    def name(self) -> str:
        """The launcher's name, which labels its own lines: ``torchrun`` or ``mpiexec``."""
        return self.typed[0] if self.typed else "torchrun"


def run(agents: list[Agent], *, timeout: float, stream: bool, script: Path,
        stacks_dir: Path | None = None, log: Path | None = None) -> Outcome:
    """Start the agents, relay their lines until all are done, and leave no process behind.

    Args:
        agents: the torchrun agents, one per (simulated) node; or one mpiexec.
        timeout: seconds before every process is stopped and ``Outcome.timed_out`` set.
        stream: print each line into the cell as it arrives (else a progress bar).
        script: the script the workers run, for the messages.
        stacks_dir: where the workers write their stacks, asked for on a timeout or interrupt.
        log: a file that receives every line, shown or not.

    Raises:
        LaunchInterrupted: the cell was interrupted while the launch ran.
    """
    outcome = Outcome()
    lines: queue.Queue = queue.Queue()
    procs: list[subprocess.Popen] = []
    watchers: list[_ProcessWatcher] = []
    echo = Echo(stream, len(agents) > 1, script, timeout, log)
    launcher = agents[0].name
    workers = "workers" if launcher == "torchrun" else "ranks"
    failure: str | None = "stopped"  # what the progress bar says when it closes
    start = time.monotonic()
    try:
        for node, agent in enumerate(agents):
            proc = subprocess.Popen(agent.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=agent.env, start_new_session=True,
                                    preexec_fn=_prepare_child(agent.cores))
            procs.append(proc)
            watchers.append(_ProcessWatcher(proc.pid, agent.workers_below))
            for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
                threading.Thread(target=read_lines, args=(pipe, name, node, agent.name, lines),
                                 daemon=True).start()
        try:
            _relay(agents, procs, watchers, lines, outcome, echo, start, timeout, stacks_dir)
        except KeyboardInterrupt:
            if not all(proc.poll() is not None for proc in procs):
                raise
            # Every agent had exited: the run is complete, only its last lines are in flight.
            _relay(agents, procs, watchers, lines, outcome, echo, start, timeout, stacks_dir)
            echo.note(f"The interrupt came after {script.name} had finished: its result is kept.")
        outcome.returncode = next((proc.returncode for proc in procs if proc.returncode), 0)
        failure = ("timed out: every process stopped" if outcome.timed_out else
                   f"failed (exit code {outcome.returncode})" if outcome.returncode else None)
    except KeyboardInterrupt:
        echo.stopping()
        dumps = _ask_for_stacks(watchers, stacks_dir)
        _stop_all(procs, watchers)
        where = "".join(f"\n    {line}" for line in stacks.where(dumps, script))
        raise LaunchInterrupted(
            f"Launch of {script.name} interrupted: {launcher} and all its {workers} were stopped."
            + (f"\nWhere each rank was:{where}" if where else "") + echo.kept()) from None
    except BaseException as exc:
        echo.stopping()
        _stop_all(procs, watchers)
        print(f"\nLaunch of {script.name} ended by {exc!r}: {launcher} and all its {workers} "
              "were stopped.", file=sys.stderr, flush=True)
        raise
    finally:
        for watcher in watchers:
            watcher.kill_leftovers()
        outcome.failed_bar = echo.close(failure)
    outcome.wall_time = time.monotonic() - start
    outcome.restarted_at = max((w.restarted_at for w in watchers if w.restarted_at), default=None)
    if echo.hidden:
        echo.note(echo.kept().strip())
    return outcome


def _relay(agents: list[Agent], procs: list[subprocess.Popen],
           watchers: list[_ProcessWatcher], lines: queue.Queue, outcome: Outcome, echo: Echo,
           start: float, timeout: float, stacks_dir: Path | None) -> None:
    """Pass lines to ``echo`` until every pipe is closed; stop at the timeout or on a failure
    (if one of several agents fails, the others' workers would wait until the timeout)."""
    refreshed = 0.0
    first_raised: float | None = None  # when a rank under mpiexec began its error report
    while echo.open_streams(len(procs)):
        now = time.monotonic()
        if now - refreshed >= 0.5:  # while lines flow too: a rank that dies fast is still seen
            refreshed = now
            for watcher in watchers:
                watcher.refresh()
                watcher.note_workers()
            if echo.ranks_started is None and any(w.worker_pids for w in watchers):
                echo.ranks_started = now
        try:
            item = lines.get(timeout=0.1)
        except queue.Empty:
            stopped = echo.quiet_agents
            if not outcome.timed_out and time.monotonic() - start > timeout:
                outcome.timed_out = True
                echo.stopping()
                outcome.stacks = _ask_for_stacks(watchers, stacks_dir)
                _stop_all(procs, watchers)
            elif not stopped and ((len(procs) > 1 and any(p.poll() not in (None, 0) for p in procs))
                                  or (first_raised is not None
                                      and time.time() - first_raised >= RANK_ERROR_GRACE_S)):
                echo.stopping()
                outcome.stopped_at = time.time()
                _stop_all(procs, watchers)
            echo.tick()
            continue
        if item is None:
            echo.closed_streams += 1
            continue
        line = parse(*item)
        if (first_raised is None and agents[0].name == "mpiexec" and line.rank is not None
                and line.stream == "stderr" and line.text.startswith((TRACEBACK, CRASH))):
            first_raised = line.time  # (torchrun stops its workers itself)
        outcome.lines.append(line)
        echo(line)
    for proc in procs:
        proc.wait()


def _ask_for_stacks(watchers: list[_ProcessWatcher], folder: Path | None) -> dict[int, str]:
    """Have the ranks, which alone registered SIGUSR1 (``worker_site``), write their stacks."""
    if folder is None or not hasattr(signal, "SIGUSR1"):
        return {}
    asked = 0
    for watcher in watchers:
        for worker in watcher.workers():
            try:
                worker.send_signal(signal.SIGUSR1)
                asked += 1
            except psutil.Error:
                pass
    deadline = time.monotonic() + STACKS_WAIT_S
    dumps = stacks.read(folder)
    while asked and time.monotonic() < deadline:
        time.sleep(0.2)
        latest = stacks.read(folder)
        if len(latest) >= asked and latest == dumps:  # all written, nothing growing
            break
        dumps = latest
    return stacks.read(folder)


def _prepare_child(cores: list[int]):
    """A ``preexec_fn``: pin the agent to ``cores``; on Linux, SIGTERM it if this process dies."""
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
    """Every process the launch started, read while the tree is intact (workers get re-parented)."""

    def __init__(self, pid: int, workers_below: int = 1):
        self.root = psutil.Process(pid)
        self.workers_below = workers_below
        self.seen: dict[int, psutil.Process] = {pid: self.root}
        self.worker_pids: set[int] = set()  # every worker seen, of every attempt
        self.restarted_at: float | None = None  # the time.time() torchrun last replaced them
        self._empty_since: float | None = None
        self._looked_at: float | None = None

    def note_workers(self) -> None:
        """Keep when a set of workers replaced the last (torchrun restarts them all together):
        the first look at which none was running, else the last look before the new ones."""
        now = time.time()
        alive = {p.pid for p in self.workers() if _running(p)}
        if alive and self.worker_pids and not alive & self.worker_pids:
            self.restarted_at = self._empty_since or self._looked_at
        self._empty_since = None if alive else (self._empty_since or now)
        self.worker_pids |= alive
        self._looked_at = now

    def refresh(self) -> None:
        try:
            for child in self.root.children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.Error:
            pass

    def workers(self) -> list[psutil.Process]:
        """The ranks: the processes ``workers_below`` levels under the launcher."""
        level = [self.root]
        for _ in range(self.workers_below):
            below = []
            for process in level:
                try:
                    below += process.children()
                except psutil.Error:
                    pass
            level = below
        return level

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
    """SIGTERM to every launcher (each stops its workers), then SIGKILL to whatever is left."""
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
