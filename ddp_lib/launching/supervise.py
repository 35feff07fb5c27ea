"""Run a launcher (torchrun agents, or mpiexec) as children of the notebook's kernel, relay the
ranks' output, leave nothing.

torchrun starts each worker in a session of its own, so killing the agent's process group would
orphan the workers: the agent is asked to stop first (SIGTERM, it then stops its workers), and
only after a grace period is every process the launch ever started killed. MPICH's mpiexec does
the same through one proxy per machine, and passes SIGTERM on to its ranks. The launcher also
gets SIGTERM if the kernel dies (Linux parent-death signal). Each line a launcher relays is
labelled with the rank that printed it (torchrun's ``[rankN]: `` prefix, which mpiexec is asked to
print too) and the agent (node) it came through.

torchrun stops every worker as soon as one fails; mpiexec only when a rank dies of a signal. A
rank of an mpiexec launch that raises writes its exception to a file (``worker_site``), and the
launch then stops the others itself: they would wait for it in their next collective until the
timeout.
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
from ddp_lib.launch_result import LaunchInterrupted, Line

STOP_GRACE_S = 10.0
STACKS_WAIT_S = 3.0  # how long the workers get to write their stacks before they are stopped
# How long an mpiexec launch waits, after a rank wrote its uncaught exception, for the others to
# say what they saw before it stops them (their own errors, printed as they exit).
RANK_ERROR_GRACE_S = 2.0


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
    """One launcher process to start: a torchrun agent (one per node), or mpiexec.

    ``typed`` is the command as a person types it (``torchrun ...``), ``command`` what runs it.
    ``workers_below`` says how far down the process tree the ranks are: torchrun's children,
    mpiexec's grandchildren (under its proxy). ``rank_errors`` is the folder where the ranks
    write their uncaught exceptions when the launcher itself does not stop the others after a
    failure (mpiexec); ``None`` for torchrun.
    """

    command: list[str]
    env: dict[str, str]
    cores: list[int] = field(default_factory=list)
    typed: list[str] = field(default_factory=list)
    workers_below: int = 1
    rank_errors: Path | None = None

    @property
    def name(self) -> str:
        """The launcher's name, which labels its own lines: ``torchrun`` or ``mpiexec``."""
        return self.typed[0] if self.typed else "torchrun"


def run(agents: list[Agent], *, timeout: float, stream: bool, script: Path,
        stacks_dir: Path | None = None, log: Path | None = None) -> Outcome:
    """Start the agents, relay their lines until all are done, and leave no process behind.

    If one agent fails while others still run (a node whose workers crashed), the others are
    stopped at once: their workers would otherwise wait for the lost ranks until the timeout.
    So is an mpiexec launch ``RANK_ERROR_GRACE_S`` after one of its ranks raised.
    A cell is never silent for long: a quiet launch (``stream=False``) shows a progress bar fed
    by the ranks' lines, and a streamed one that has printed nothing for ``SILENCE_S`` says that
    it is still waiting, and until when. An interrupt that arrives after every agent has exited
    keeps the finished run.

    Args:
        agents: the torchrun agents to start, one per (simulated) node; or one mpiexec.
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
    launcher = agents[0].name
    workers = "workers" if launcher == "torchrun" else "ranks"
    start = time.monotonic()
    try:
        for node, agent in enumerate(agents):
            proc = subprocess.Popen(
                agent.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=agent.env, start_new_session=True,
                preexec_fn=_prepare_child(agent.cores),
            )
            procs.append(proc)
            watchers.append(_ProcessWatcher(proc.pid, agent.workers_below))
            for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
                threading.Thread(target=_read_lines, args=(pipe, name, node, agent.name, lines),
                                 daemon=True).start()
        try:
            _relay(agents, procs, watchers, lines, outcome, echo, start, timeout, stacks_dir)
        except KeyboardInterrupt:
            if not all(proc.poll() is not None for proc in procs):
                raise
            # Every agent had exited: the run is complete, only its last lines are in flight.
            _relay(agents, procs, watchers, lines, outcome, echo, start, timeout, stacks_dir)
            echo.note(f"The interrupt came after {script.name} had finished: its result is "
                      "kept.")
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
        echo.close()
    outcome.wall_time = time.monotonic() - start
    codes = [proc.returncode for proc in procs]
    outcome.returncode = next((code for code in codes if code != 0), 0)
    if echo.hidden:
        echo.note(echo.kept().strip())
    return outcome


def _relay(agents: list[Agent], procs: list[subprocess.Popen],
           watchers: list[_ProcessWatcher], lines: queue.Queue, outcome: Outcome, echo: _Echo,
           start: float, timeout: float, stacks_dir: Path | None) -> None:
    """Pass the agents' lines to ``echo`` until every pipe is closed, stopping the launch at its
    timeout, when one of several agents has failed, or when a rank of mpiexec's has raised."""
    refreshed = 0.0
    while echo.open_streams(len(procs)):
        now = time.monotonic()
        if now - refreshed >= 0.5:  # while lines flow too: a rank that dies fast is still seen
            refreshed = now
            for watcher in watchers:
                watcher.refresh()
        try:
            item = lines.get(timeout=0.1)
        except queue.Empty:
            stopped = echo.quiet_agents
            if not outcome.timed_out and time.monotonic() - start > timeout:
                outcome.timed_out = True
                echo.stopping()
                outcome.stacks = _ask_for_stacks(watchers, stacks_dir)
                _stop_all(procs, watchers)
            elif not stopped and (
                    (len(procs) > 1 and any(p.poll() not in (None, 0) for p in procs))
                    or any(_raised_a_while_ago(agent) for agent in agents)):
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


def _raised_a_while_ago(agent: Agent) -> bool:
    """Whether a rank of ``agent`` wrote its uncaught exception ``RANK_ERROR_GRACE_S`` ago."""
    if agent.rank_errors is None:
        return False
    try:
        written = [entry.stat().st_mtime for entry in os.scandir(agent.rank_errors)
                   if entry.name.endswith(".json")]
    except OSError:
        return False
    return bool(written) and time.time() - min(written) >= RANK_ERROR_GRACE_S


def _ask_for_stacks(watchers: list[_ProcessWatcher], folder: Path | None) -> dict[int, str]:
    """Have every worker write its stacks (SIGUSR1, see ``worker_site``); rank -> the dump.

    Only the ranks are asked, which registered the signal: the launcher's processes did not,
    and a DataLoader's worker processes are not ranks.
    """
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
    """Remembers every process the launch started, even after its launcher is gone.

    Workers live in sessions of their own and are re-parented when the agent dies, so the tree
    is read while it is intact, and anything still alive at the end is killed.
    """

    def __init__(self, pid: int, workers_below: int = 1):
        self.root = psutil.Process(pid)
        self.workers_below = workers_below
        self.seen: dict[int, psutil.Process] = {pid: self.root}

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


def _read_lines(pipe, stream: str, node: int, launcher: str, out: queue.Queue) -> None:
    with pipe:
        for raw in iter(pipe.readline, b""):
            out.put((stream, raw.decode("utf-8", errors="replace").rstrip("\r\n"), node,
                     launcher))
    out.put(None)


def parse(stream: str, text: str, node: int = 0, launcher: str = "torchrun") -> Line:
    """The line as printed by a rank (its ``[rankN]: `` label removed) or by the launcher."""
    match = torchrun.RANK_PREFIX.match(text)
    if not match:
        return Line(launcher, stream, text, node)
    rank = match.group(1)
    text = text[match.end():]
    if launcher == "mpiexec":  # mpiexec labels each piece it reads: a line written in pieces
        text = text.replace(f"[rank{rank}]: ", "")  # (faulthandler's) has labels inside
    # PyTorch prefixes uncaught exceptions in workers with the rank itself: drop the repeat.
    repeat = f"[rank{rank}]: "
    if text.startswith(repeat):
        text = text[len(repeat):]
    return Line(f"rank{rank}", stream, text, node)


# The first line of a launcher's report on failed ranks, which the failure message says again:
# torchrun's traceback, and MPICH's banner ("BAD TERMINATION OF ONE OF YOUR APPLICATION ...").
_LAUNCHER_REPORT = ("Traceback (most recent call last)", "=" * 20)


class _Echo:
    """What the cell shows of a launch while it runs, and the run's log file.

    Lines are printed one write per line, so ranks never interleave mid-line. Some lines are
    kept in the result and the log but not shown, because the message ``launch`` raises says
    the same in fewer words: torchrun's traceback after a failed worker (mpiexec's banner after a
    rank killed by a signal), what the launcher says while the
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
        source = (f"{line.source} node{line.node}" if line.rank is None and self.multi_node
                  else line.source)
        if self.log:
            self.log.write(f"[{source}] {line.text}\n")
            self.log.flush()
        if line.rank is None and line.text.startswith(_LAUNCHER_REPORT):
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
        if line.rank is None:
            return self.quiet_agents or line.node in self.agent_traceback
        return line.text.startswith("Extension modules: ")

    def tick(self) -> None:
        """Called while no line arrives: keep the bar's clock going, or say what is awaited."""
        now = time.monotonic()
        if self.bar is not None:
            if now - self.bar_drawn >= 1.0:  # the clock moves in seconds
                self.bar_drawn = now
                silent = now - self.last_line
                if not self.rank_lines and silent >= self.SILENCE_S:
                    # past start-up: the ranks were started and have printed nothing since
                    self.bar.set_postfix_str(
                        f"started, no line from the ranks for {silent:.0f} s (timeout "
                        f"{self.timeout:g} s, {max(0.0, self.deadline - now):.0f} s left)",
                        refresh=False)
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
        """From now on the launcher only reports being stopped: keep that out of the cell."""
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
        return (f"\n({self.hidden} line{'s' if self.hidden > 1 else ''} of the launcher's and "
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
