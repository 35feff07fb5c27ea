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
from pathlib import Path

import psutil

from ddp_lib import stacks, torchrun
from ddp_lib.launch_result import LaunchInterrupted

AGENT = "torchrun"
STOP_GRACE_S = 10.0
STACKS_WAIT_S = 3.0  # how long the workers get to write their stacks before they are stopped


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
    stacks: dict[int, str] = field(default_factory=dict)  # rank -> its threads' stacks


@dataclass
class Agent:
    """One torchrun agent to start: its command, environment and (optionally) its CPU cores.

    ``typed`` is the command as a person types it (``torchrun ...``), ``command`` what runs it.
    """

    command: list[str]
    env: dict[str, str]
    cores: list[int] = field(default_factory=list)
    typed: list[str] = field(default_factory=list)


def run(agents: list[Agent], *, timeout: float, stream: bool, script: Path,
        stacks_dir: Path | None = None, log: Path | None = None) -> Outcome:
    """Start the agents, relay their lines until all are done, and leave no process behind.

    If one agent fails while others still run (a node whose workers crashed), the others are
    stopped at once: their workers would otherwise wait for the lost ranks until the timeout.
    A cell is never silent for long: a quiet launch (``stream=False``) shows a progress bar fed
    by the ranks' lines, and a streamed one that has printed nothing for ``SILENCE_S`` says that
    it is still waiting, and until when. An interrupt that arrives after every agent has exited
    keeps the finished run.

    Args:
        agents: the torchrun agents to start, one per (simulated) node.
        timeout: seconds before every process is stopped and ``Outcome.timed_out`` set.
        stream: print each line into the cell as it arrives.
        script: the script the workers run, for the messages of an interrupted launch.
        stacks_dir: where the workers write their stacks when asked (``stacks.ENV_VAR`` in
            their environment); on a timeout or an interrupt they are asked before being
            stopped, and what they wrote ends up in ``Outcome.stacks``.
        log: a file that receives every line, shown or not (the run's whole output).

    Raises:
        LaunchInterrupted: the cell was interrupted while the launch ran.
    """
    outcome = Outcome()
    lines: queue.Queue = queue.Queue()
    procs: list[subprocess.Popen] = []
    watchers: list[_ProcessWatcher] = []
    echo = _Echo(stream, len(agents) > 1, script, timeout, log)
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
        try:
            _relay(procs, watchers, lines, outcome, echo, start, timeout, stacks_dir)
        except KeyboardInterrupt:
            if not all(proc.poll() is not None for proc in procs):
                raise
            # Every agent had exited: the run is complete, only its last lines are in flight.
            _relay(procs, watchers, lines, outcome, echo, start, timeout, stacks_dir)
            echo.note(f"The interrupt came after {script.name} had finished: its result is "
                      "kept.")
    except KeyboardInterrupt:
        echo.stopping()
        dumps = _ask_for_stacks(procs, stacks_dir)
        _stop_all(procs, watchers)
        where = "".join(f"\n    {line}" for line in stacks.where(dumps, script))
        raise LaunchInterrupted(
            f"Launch of {script.name} interrupted: torchrun and all its workers were stopped."
            + (f"\nWhere each rank was:{where}" if where else "") + echo.kept()) from None
    except BaseException as exc:
        echo.stopping()
        _stop_all(procs, watchers)
        print(f"\nLaunch of {script.name} ended by {exc!r}: torchrun and all its workers "
              "were stopped.", file=sys.stderr, flush=True)
        raise
    finally:
        for watcher in watchers:
            watcher.kill_leftovers()
        echo.close()
    outcome.wall_time = time.monotonic() - start
    codes = [proc.returncode for proc in procs]
    outcome.returncode = next((code for code in codes if code != 0), 0)
    if echo.hidden:
        echo.note(echo.kept().strip())
    return outcome


def _relay(procs: list[subprocess.Popen], watchers: list[_ProcessWatcher], lines: queue.Queue,
           outcome: Outcome, echo: _Echo, start: float, timeout: float,
           stacks_dir: Path | None) -> None:
    """Pass the agents' lines to ``echo`` until every pipe is closed, stopping the launch at its
    timeout, or when one of several agents has failed."""
    while echo.open_streams(len(procs)):
        try:
            item = lines.get(timeout=0.1)
        except queue.Empty:
            for watcher in watchers:
                watcher.refresh()
            if not outcome.timed_out and time.monotonic() - start > timeout:
                outcome.timed_out = True
                echo.stopping()
                outcome.stacks = _ask_for_stacks(procs, stacks_dir)
                _stop_all(procs, watchers)
            elif len(procs) > 1 and any(p.poll() not in (None, 0) for p in procs):
                echo.stopping()
                _stop_all(procs, watchers)
            echo.tick()
            continue
        if item is None:
            echo.closed_streams += 1
            continue
        line = parse(*item)
        outcome.lines.append(line)
        echo(line)
    for proc in procs:
        proc.wait()


def _ask_for_stacks(procs: list[subprocess.Popen], folder: Path | None) -> dict[int, str]:
    """Have every worker write its stacks (SIGUSR1, see ``worker_site``); rank -> the dump.

    Only the agents' own children are asked: they are the workers, which registered the signal.
    The agent did not, and a DataLoader's worker processes are not ranks.
    """
    if folder is None or not hasattr(signal, "SIGUSR1"):
        return {}
    asked = 0
    for proc in procs:
        try:
            workers = psutil.Process(proc.pid).children()
        except psutil.Error:
            continue
        for worker in workers:
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
    """What the cell shows of a launch while it runs, and the run's log file.

    Lines are printed one write per line, so ranks never interleave mid-line. Some lines are
    kept in the result and the log but not shown, because the message ``launch`` raises says
    the same in fewer words: torchrun's traceback after a failed worker, what it says while the
    launch is being stopped, and faulthandler's list of loaded extension modules (one line
    of 30 module names under every native crash report). With ``stream=False`` the cell shows a
    progress bar instead of the lines.
    """

    SILENCE_S = 5.0  # a streamed launch that printed nothing for this long says it waits

    def __init__(self, stream: bool, multi_node: bool, script: Path, timeout: float,
                 log: Path | None):
        self.stream = stream
        self.multi_node = multi_node
        self.script = script
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.log_path = log
        self.log = log.open("w", encoding="utf-8") if log else None
        self.closed_streams = 0
        self.rank_lines = 0
        self.hidden = 0
        self.agent_traceback: set[int] = set()
        self.quiet_agents = False
        self.last_line = time.monotonic()
        self.waiting_said = 0.0
        self.bar = None if stream else _progress_bar(script)
        self.bar_drawn = 0.0

    def open_streams(self, agents: int) -> bool:
        return self.closed_streams < 2 * agents

    def __call__(self, line: Line) -> None:
        self.last_line = time.monotonic()
        source = (f"{line.source} node{line.node}" if line.source == AGENT and self.multi_node
                  else line.source)
        if self.log:
            self.log.write(f"[{source}] {line.text}\n")
            self.log.flush()
        if line.source == AGENT and line.text.startswith("Traceback (most recent call last)"):
            self.agent_traceback.add(line.node)
        self.rank_lines += line.rank is not None
        if self._folded(line):
            self.hidden += 1
        elif self.bar is not None:
            if line.rank is not None:
                self.bar.update(1)
                self.bar.set_postfix_str(f"rank {line.rank}: {line.text[:60]}", refresh=False)
        elif self.stream:
            target = sys.stderr if line.stream == "stderr" else sys.stdout
            target.write(f"[{source}] {line.text}\n")
            target.flush()

    def _folded(self, line: Line) -> bool:
        if line.source == AGENT:
            return self.quiet_agents or line.node in self.agent_traceback
        return line.text.startswith("Extension modules: ")

    def tick(self) -> None:
        """Called while no line arrives: keep the bar's clock going, or say what is awaited."""
        now = time.monotonic()
        if self.bar is not None:
            if now - self.bar_drawn >= 1.0:  # the clock moves in seconds
                self.bar_drawn = now
                self.bar.refresh()
            return
        silent = now - self.last_line
        if self.stream and not self.quiet_agents and silent >= self.SILENCE_S \
                and now - self.waiting_said >= max(self.SILENCE_S, silent / 2):
            self.waiting_said = now
            left = max(0.0, self.deadline - now)
            starting = "" if self.rank_lines else " (starting takes seconds: each imports torch)"
            self.note(f"{silent:.0f} s without a line from the ranks{starting}; waiting up to "
                      f"the timeout, {self.timeout:g} s ({left:.0f} s left)")

    def stopping(self) -> None:
        """From now on torchrun only reports being stopped: keep that out of the cell."""
        self.quiet_agents = True

    def note(self, text: str) -> None:
        """A line of the launch's own, printed even when the ranks' lines are not."""
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(f"[launch] {text}", flush=True)

    def kept(self) -> str:
        """Where the lines not shown are, for the end of a message; ``""`` if none were hidden."""
        if not self.hidden or self.log_path is None:
            return ""
        return (f"\n({self.hidden} line{'s' if self.hidden > 1 else ''} of torchrun's and "
                f"faulthandler's reports not shown: the whole output is in {self.log_path})")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.log:
            self.log.close()
            self.log = None


def _progress_bar(script: Path):
    """A bar that counts the lines the ranks print: a widget in a notebook, text elsewhere.

    ``tqdm.auto``'s trouble with iterables (lesson 01, note 1) does not arise: nothing is
    iterated here.
    """
    from tqdm.auto import tqdm

    bar = tqdm(desc=script.name, unit=" lines", disable=False, mininterval=0.5,
               bar_format="{desc}: {n_fmt}{unit} from the ranks [{elapsed}]{postfix}")
    bar.set_postfix_str("starting: each rank imports torch", refresh=False)
    return bar
