"""What a launch that ended badly says: which rank failed and how, then what every failed or
stopped rank did, by time; or that torchrun refused its command line.

The record: torchrun's for each failed rank (``records``: its exit code or signal, when torchrun
saw it end, to the second, and the exception ``@record`` wrote, to the millisecond); each rank's
printed traceback or faulthandler report, timed when the launch read it (a script without
``@record``, and every rank under mpiexec; torchrun copies each worker's output every 0.1 s,
``tail_log.py``, so up to 0.1 s late); whom torchrun stopped (``Sending process PID closing
signal`` in its log), and when the launch stopped mpiexec's ranks. The rank named is the first
that failed by itself. A rank that ended without a report (SIGKILL: out of memory, or by hand)
has only torchrun's second, and torchrun looks every 0.1 s (``--monitor-interval``): it is placed
at the start of the second before, ahead of the errors its end caused in its peers.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import signal
import time
from dataclasses import dataclass

from ddp_lib.launching import records, stacks
from ddp_lib.launching.records import Failure
from ddp_lib.launching.result import LaunchResult

TRACEBACK = "Traceback (most recent call last)"  # how Python's report of an exception begins
CRASH = "Fatal Python error"  # how faulthandler's report of a native crash begins
_STOPPED = re.compile(r"Sending process (\d+) closing signal (SIG[A-Z]+)")  # torchrun's log


@dataclass(frozen=True)
class RankEnd:
    """How one rank of a failed launch ended, as far as it was recorded."""

    rank: int
    error: str = ""  # its uncaught exception ("ValueError: ...") or faulthandler's first line
    error_at: float | None = None  # when it raised or crashed, to the millisecond
    exitcode: int | None = None  # torchrun's record (negative: the signal); None: none kept
    seen_at: int | None = None  # when torchrun saw it end, to the second
    stopped_by: str = ""  # "torchrun (SIGTERM)": the launcher stopped it
    stopped_at: float | None = None

    @property
    def by_itself(self) -> bool:
        """It raised or crashed, or ended badly without a launcher stopping it."""
        return bool(self.error) or (self.exitcode not in (None, 0) and not self.stopped_by)

    @property
    def at(self) -> float | None:
        """When it failed, as recorded: its report's time, else the stop's, else torchrun's."""
        if self.error:
            return self.error_at
        return self.stopped_at if self.stopped_by else self.seen_at

    @property
    def to_the_second(self) -> bool:
        return not self.error and self.at is not None and self.at == self.seen_at

    @property
    def earliest(self) -> float:
        """The earliest it can have failed, by its record (see the module's text)."""
        return math.inf if self.at is None else self.at - 1 if self.to_the_second else self.at


def rank_ends(result: LaunchResult) -> list[RankEnd]:
    """Every rank that failed or was stopped, by time (see the module's text)."""
    failed = result.failure_report.failures
    launcher = _launcher(result)
    stops = {pid: (name, at) for pid, name, at in _stops(result)}
    ends = []
    for rank in sorted({*failed, *result.ranks()}):
        record = failed.get(rank)
        error, error_at = _error(result, rank)
        if record is None and not error:
            continue
        stop_name, stop_at = stops.get(record.pid, ("", None)) if record else ("", None)
        ends.append(RankEnd(rank, error, error_at,
                            exitcode=record.exitcode if record else None,
                            seen_at=record.timestamp if record else None,
                            stopped_by=f"{launcher} ({stop_name})" if stop_name else "",
                            stopped_at=stop_at))
    return sorted(ends, key=lambda e: (e.earliest, e.rank))


def root_cause(result: LaunchResult) -> tuple[int | None, int | None]:
    """The first rank that failed by itself and its exit code (``None``: not recorded)."""
    ends = rank_ends(result)
    first = next((e for e in ends if e.by_itself), ends[0] if ends else None)
    return (first.rank, first.exitcode) if first else (None, result.returncode)


def raised_errors(result: LaunchResult) -> dict[int, Failure]:
    """rank -> torchrun's record, for every rank whose ``@record`` wrote its exception."""
    return {rank: failure for rank, failure in result.failure_report.failures.items()
            if failure.message is not None}


def last_error(result: LaunchResult, rank: int) -> str:
    """``rank``'s uncaught exception or crash: from its error file, else from its output."""
    return _error(result, rank)[0]


def _error(result: LaunchResult, rank: int) -> tuple[str, float | None]:
    """``rank``'s uncaught exception (or faulthandler's first line) and when it came, else ``""``.
    Only the last attempt's (an earlier attempt's error, before torchrun restarted the workers,
    is not this failure's)."""
    recorded = raised_errors(result).get(rank)
    if recorded:
        return recorded.message, recorded.raised_at
    text, at = "", None
    for line in result.last_attempt(f"rank{rank}", "stderr"):
        if line.text.startswith((TRACEBACK, CRASH)):
            at, text = line.time or None, line.text if line.text.startswith(CRASH) else ""
        elif at is not None and not text and line.text.strip() and line.text[0] not in " \t":
            text = line.text.strip()  # the first unindented line after the frames: the exception
    return text, at


def _stops(result: LaunchResult) -> list[tuple[int, str, float | None]]:
    """``(pid, signal's name, when)`` for each worker torchrun's log says it stopped."""
    found = ((_STOPPED.search(line.text), line.time) for line in result.last_attempt()
             if line.rank is None)
    return [(int(match.group(1)), match.group(2), at or None) for match, at in found if match]


def refusal_message(result: LaunchResult, complaint: str) -> str:
    import torch

    return (f"torchrun refused its command line, so no worker ran: {complaint}\n"
            f"The command: {shlex.join(result.command)}\n"
            f"The installed torchrun is torch {torch.__version__}'s; `torchrun --help` lists "
            "what it accepts.")


def _crash_report(text: str) -> str:
    """faulthandler's report of a native crash (``worker_site``), without its module list."""
    start = text.rfind(CRASH)
    if start < 0:
        return ""
    lines = text[start:].splitlines()
    return "\n".join(line for line in lines if not line.startswith("Extension modules:")).rstrip()


def crash_location(report: str, script: str | os.PathLike) -> str:
    """The line of ``script`` that faulthandler's "Current thread" (else any thread) was on."""
    current = next((block for block in report.split("\n\n")
                    if block.lstrip().startswith("Current thread")), "")
    frame = stacks.innermost_in(current, script)
    if frame:
        return f"It crashed at {frame.describe()}"
    frame = stacks.innermost_in(report, script)
    return (f"It crashed outside the script's own frames, while the script was at "
            f"{frame.describe()}" if frame else "")


def _traceback(text: str) -> str:
    start = text.rfind(TRACEBACK)
    return text[start:] if start >= 0 else ""


def _signal_name(exitcode: int) -> str:
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _how_it_ended(end: RankEnd | None, exitcode: int | None, launcher: str) -> str:
    raised = bool(end and end.error and not end.error.startswith(CRASH))
    if raised and exitcode is None and launcher == "mpiexec":
        return "raised an exception"  # MPICH keeps no exit code per rank
    if exitcode is None or (raised and end.stopped_by):
        return f"raised an exception, and {launcher} stopped it before it exited,"
    if exitcode < 0:
        name = _signal_name(exitcode)
        return f"was killed by {name}" + (" (out of memory, or killed by hand?)"
                                          if name == "SIGKILL" else "")
    return f"exited with code {exitcode}"


def _shortened(text: str, width: int = 110) -> str:
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


def _clock(at: float | None, to_the_second: bool = False) -> str:
    if at is None:
        return " " * 12
    shown = time.strftime("%H:%M:%S", time.localtime(at))
    return f"{shown}    " if to_the_second else f"{shown}.{int(at * 1000) % 1000:03d}"


def in_order(result: LaunchResult) -> list[str]:
    """What each failed or stopped rank did, a line each, by time."""
    launcher = _launcher(result)
    shown = []
    for end in rank_ends(result):
        parts = [_shortened(end.error)] if end.error else []
        if end.stopped_by:
            parts.append(f"stopped by {end.stopped_by} at {_clock(end.stopped_at).strip()}")
        elif end.exitcode is not None and end.exitcode < 0:
            parts.append(f"killed by {_signal_name(end.exitcode)}")
        elif end.exitcode is not None:
            parts.append(f"exited with code {end.exitcode}")
        shown.append(f"{_clock(end.at, end.to_the_second)}  rank {end.rank}: {'; '.join(parts)}"
                     + ("  (torchrun's time, to the second)" if end.to_the_second else ""))
    recorded = {failure.pid for failure in result.failure_report.failures.values()}
    shown += [f"{_clock(at)}  {launcher} stopped the worker with pid {pid} ({name})"
              for pid, name, at in _stops(result) if pid not in recorded]
    if result.stopped_at is not None:
        shown.append(f"{_clock(result.stopped_at)}  the launch stopped {launcher} and every rank "
                     "still running")
    return shown


def failure_message(result: LaunchResult, rank: int | None, exitcode: int | None) -> str:
    launcher = _launcher(result)
    who = f"Rank {rank}" if rank is not None else launcher
    if rank is None and launcher == "mpiexec":
        signal_number = records.mpiexec_signal(
            [line.text for line in result.lines if line.rank is None])
        if signal_number:  # mpiexec says which signal, not which rank (see records)
            who, exitcode = "A rank (mpiexec does not say which)", -signal_number
    end = next((e for e in rank_ends(result) if e.rank == rank), None)
    recorded = raised_errors(result).get(rank) if rank is not None else None
    source = f"rank{rank}" if rank is not None else launcher
    text = "\n".join(line.text for line in result.last_attempt(source, "stderr"))
    crash = _crash_report(text)
    tb = (recorded.traceback.rstrip() if recorded and recorded.traceback else
          crash or _traceback(text) or "\n".join(text.splitlines()[-15:]))
    parts = [f"{who} {_how_it_ended(end, exitcode, launcher)} while running "
             f"{result.script.name} (launch ended after {result.wall_time:.1f} s)."]
    where = crash_location(crash, result.script) if crash and not recorded else ""
    if where:
        parts.append(where)
    if tb:
        parts.append(f"Its error output:\n{_indent(tb)}")
    happened = in_order(result)
    if len(happened) > 1:
        parts.append("What each rank did, in order:\n" + _indent("\n".join(happened)))
    parts.append(f"All output: result.output(); torchrun's logs: {result.run_dir / 'torchrun'}"
                 if launcher == "torchrun" else
                 f"All output: result.output(), and {result.run_dir / 'output.log'}")
    return "\n".join(parts)


def timeout_message(result: LaunchResult, timeout: float) -> str:
    launcher = _launcher(result)
    parts = [f"{result.script.name} did not finish within timeout={timeout:g} s; {launcher} and "
             f"all its {'workers' if launcher == 'torchrun' else 'ranks'} were stopped."]
    where = stacks.where(result.stacks, result.script)
    if where:
        parts.append("Where each rank was:\n" + _indent("\n".join(where)))
        parts.append(f"Every thread's stack: result.stacks[rank], and in "
                     f"{result.run_dir / 'stacks'}")
    ranks = result.ranks()
    if not ranks and not where:
        parts.append("No rank printed anything: did every process reach the rendezvous "
                     "(all nodes started, the endpoint reachable)?")
    for rank in ranks:
        tail = result.output(rank).splitlines()[-3:]
        if tail:
            parts.append(f"Last lines of rank {rank}:\n{_indent(chr(10).join(tail))}")
    return "\n".join(parts)


def _launcher(result: LaunchResult) -> str:
    return result.command[0] if result.command else "torchrun"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
