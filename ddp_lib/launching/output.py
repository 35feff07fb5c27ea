"""What the cell shows of a running launch: each rank's lines, labelled, or a progress bar."""

from __future__ import annotations

import queue
import sys
import time
from pathlib import Path

from ddp_lib.launching import torchrun
from ddp_lib.launching.result import Line


def read_lines(pipe, stream: str, node: int, launcher: str, out: queue.Queue) -> None:
    """Put each line of ``pipe`` on ``out`` as it comes, with when it came, then ``None``."""
    with pipe:
        for raw in iter(pipe.readline, b""):
            out.put((stream, raw.decode("utf-8", errors="replace").rstrip("\r\n"), node, launcher,
                     time.time()))
    out.put(None)


def parse(stream: str, text: str, node: int = 0, launcher: str = "torchrun",
          at: float = 0.0) -> Line:
    """The line as printed by a rank (its ``[rankN]: `` label removed) or by the launcher; ``at``
    is when it was read."""
    match = torchrun.RANK_PREFIX.match(text)
    if not match:
        return Line(launcher, stream, text, node, at)
    rank = match.group(1)
    text = text[match.end():]
    if launcher == "mpiexec":  # mpiexec labels each piece it reads: a line written in pieces
        text = text.replace(f"[rank{rank}]: ", "")  # (faulthandler's) has labels inside
    # PyTorch prefixes uncaught exceptions in workers with the rank itself: drop the repeat.
    repeat = f"[rank{rank}]: "
    if text.startswith(repeat):
        text = text[len(repeat):]
    return Line(f"rank{rank}", stream, text, node, at)


# First line of a launcher's report on failed ranks: torchrun's traceback, MPICH's banner.
_LAUNCHER_REPORT = ("Traceback (most recent call last)", "=" * 20)


class Echo:
    """What the cell shows of a launch (one write per line: no interleaving), and its log.

    Only logged: the launcher's report and words while stopped, and faulthandler's module list.
    """

    SILENCE_S = 5.0  # a streamed launch that printed nothing for this long says it waits
    IMPORT_S = 10.0  # what a rank may take to import torch: said as such until then

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
        self.last_line = self.started = time.monotonic()
        self.ranks_started: float | None = None  # when the launch first saw its ranks' processes
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
        silent = now - self.last_line
        if self.bar is not None:
            if now - self.bar_drawn >= 1.0:  # the clock moves in seconds
                self.bar_drawn = now
                if not self.rank_lines and silent >= self.SILENCE_S:
                    self.bar.set_postfix_str(f"{self._waiting(now)} (timeout {self.timeout:g} s, "
                                             f"{max(0.0, self.deadline - now):.0f} s left)",
                                             refresh=False)
                self.bar.refresh()
            return
        if self.stream and not self.quiet_agents and silent >= self.SILENCE_S \
                and now - self.waiting_said >= max(self.SILENCE_S, silent / 2):
            self.waiting_said = now
            waiting = (self._waiting(now) if not self.rank_lines
                       else f"the ranks have printed nothing for {silent:.0f} s")
            self.note(f"{waiting}; waiting up to the timeout, {self.timeout:g} s "
                      f"({max(0.0, self.deadline - now):.0f} s left)")

    def _waiting(self, now: float) -> str:
        """What a launch whose ranks have printed nothing yet waits for, as far as it sees."""
        if self.ranks_started is None:
            return f"{now - self.started:.0f} s, and the launcher has not started the ranks yet"
        ran = now - self.ranks_started
        return f"the ranks started {ran:.0f} s ago" + (": each imports torch first" if ran <
                                                       self.IMPORT_S else ", and print nothing")

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

    def close(self, failure: str | None = None) -> object | None:
        """Close the log and the bar. A failed launch's bar is returned, red, saying ``failure``
        (tqdm.notebook would turn a bar without a total green). Else: ``None``."""
        bar, self.bar = self.bar, None
        if self.log:
            self.log.close()
            self.log = None
        if bar is not None:
            if not failure:  # a finished launch's bar says so, not what it last waited for
                bar.set_postfix_str(f"finished in {time.monotonic() - self.started:.1f} s")
            bar.close()
            if failure:
                mark_failed(bar, failure)
                return bar
        return None


def mark_failed(bar, text: str) -> None:
    """Show ``text`` on a closed progress bar, red where it is a notebook widget."""
    bar.set_postfix_str(text, refresh=False)
    if hasattr(bar, "disp"):  # tqdm.notebook's (a terminal's bar has no colour); closed or not
        bar.disp(bar_style="danger", check_delay=False)


def _progress_bar(script: Path):
    """Counts the ranks' lines; with no iterable, tqdm.auto's trouble (lesson 01) does not arise."""
    from tqdm.auto import tqdm

    bar = tqdm(desc=script.name, unit=" lines", disable=False, mininterval=0.5,
               bar_format="{desc}: {n_fmt}{unit} from the ranks [{elapsed}]{postfix}")
    bar.set_postfix_str("starting", refresh=False)
    return bar
