"""What a launch that ended badly says: which rank failed and how, or that torchrun itself did.

Every rank of a ``ddp_lib`` launch writes its uncaught exception to torchrun's error file (the
launch's ``sitecustomize`` does what ``@record`` does, adding the rank and the time to the
microsecond). The root cause is read from those files first: the rank that raised first, passing
over ranks whose error only says that a peer's process went away (Gloo's "Connection closed by
peer"): they raised because another rank had failed. If every rank that raised only lost a peer,
the cause is a rank that torchrun reports killed by a signal, which left no file (killed by hand,
or by the kernel when out of memory). A rank killed by SIGTERM is one torchrun stopped because
another failed: it is the cause only when no other rank failed.

Without error files (the worker died before ``sitecustomize`` ran, or torchrun kept none), the
root cause is torchrun's own report (``Root Cause (first observed failure)``): "first observed" is
when the agent noticed, to the second, so when ranks fail within a second of each other it names
the lowest, and the same peer-gone rule applies. The message lists the last error line of every
other rank that raised, so both sides of a failure are in view.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
from dataclasses import dataclass

from ddp_lib import stacks
from ddp_lib.launch_result import LaunchResult
from ddp_lib.supervise import AGENT

# One failure of torchrun's report: its "rank :" line, then its "exitcode :" line. Anchored to
# those two lines, because the agent's log lines before the report also say "exitcode: -15)
# local_rank: 0", in the other order, and in whatever order the agent happened to log them.
_FAILURE_ENTRY = r"^\s+rank\s+:\s*(-?\d+)[^\n]*\n\s+exitcode\s+:\s*(-?\d+)"
_ROOT_CAUSE = re.compile(r"Root Cause.*?" + _FAILURE_ENTRY, re.DOTALL | re.MULTILINE)
_REPORTED_FAILURE = re.compile(_FAILURE_ENTRY, re.MULTILINE)
# What a rank raises when a peer's process went away first: a consequence, not a cause.
_PEER_GONE = re.compile(r"Connection (closed|reset) by peer", re.IGNORECASE)


@dataclass(frozen=True)
class RaisedError:
    """A rank's uncaught exception, as its torchrun error file holds it."""

    rank: int
    message: str  # "ValueError: ..."
    traceback: str
    time: float  # seconds since the epoch


def raised_errors(result: LaunchResult) -> dict[int, RaisedError]:
    """rank -> its uncaught exception in the last attempt, from torchrun's error files."""
    attempts = result.run_dir.glob("torchrun*/*/attempt_*")
    last = max((int(a.name.removeprefix("attempt_")) for a in attempts), default=None)
    found = {}
    for path in result.run_dir.glob(f"torchrun*/*/attempt_{last}/*/error.json"):
        try:
            error = json.loads(path.read_text(encoding="utf-8"))["message"]
            extra = error["extraInfo"]
            found[int(extra["rank"])] = RaisedError(int(extra["rank"]), error["message"],
                                                    extra["py_callstack"], float(extra["time"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not one of ours (a script's own @record has no rank), or unreadable
    return found


def root_cause(result: LaunchResult) -> tuple[int | None, int | None]:
    """The rank whose failure ended the launch and its exit code (``None``: not reported)."""
    report = result.output(AGENT)
    exitcodes = _reported_exitcodes(report)
    raised = raised_errors(result)
    if raised:
        by_time = sorted(raised.values(), key=lambda e: e.time)
        causes = [e for e in by_time if not _PEER_GONE.search(e.message)]
        if causes:
            return causes[0].rank, exitcodes.get(causes[0].rank)
        # Every rank that raised only lost a peer: the peer died without raising.
        # A SIGTERM is torchrun stopping the rest: a rank killed otherwise comes first.
        killed = sorted((code == -signal.SIGTERM, r) for r, code in exitcodes.items()
                        if code < 0 and r not in raised)
        first = killed[0][1] if killed else by_time[0].rank
        return first, exitcodes.get(first)
    match = _ROOT_CAUSE.search(report)
    if not match:
        return None, result.returncode
    rank, exitcode = int(match.group(1)), int(match.group(2))
    failed = [r for r, code in exitcodes.items() if code != -signal.SIGTERM]
    if exitcode == -signal.SIGTERM and failed:
        # "First observed" is to the second: with no error files (a rank waiting in NCCL raises
        # nothing), a rank torchrun stopped can tie with the one that died, and be listed first.
        return min(failed), exitcodes[min(failed)]
    if _PEER_GONE.search(last_error(result, rank)):
        for other in result.ranks():
            error = last_error(result, other)
            if other != rank and error and not _PEER_GONE.search(error):
                return other, exitcodes.get(other)
    return rank, exitcode


def _reported_exitcodes(report: str) -> dict[int, int]:
    """rank -> exit code of every failure torchrun's report lists."""
    return {int(r): int(code) for r, code in _REPORTED_FAILURE.findall(report)}


def last_error(result: LaunchResult, rank: int) -> str:
    """``rank``'s uncaught exception (``"ValueError: ..."``), or ``""``.

    From its error file, else the last line of the last traceback it printed.
    """
    raised = raised_errors(result).get(rank)
    if raised:
        return raised.message
    lines = _traceback(result.output(rank, stream="stderr")).strip().splitlines()
    return lines[-1].strip() if lines else ""


_PARSER_ERROR = re.compile(r"^\S+: error: (.+)$", re.MULTILINE)


def refusal(result: LaunchResult) -> str | None:
    """torchrun's own complaint about its command line, if that is why no worker ran."""
    if result.ranks():
        return None
    match = _PARSER_ERROR.search(result.output(AGENT, stream="stderr"))
    return match.group(1) if match else None


def refusal_message(result: LaunchResult, complaint: str) -> str:
    import torch

    return (f"torchrun refused its command line, so no worker ran: {complaint}\n"
            f"The command: torchrun {shlex.join(result.command[3:])}\n"
            f"The installed torchrun is torch {torch.__version__}'s; `torchrun --help` lists "
            "what it accepts.")


def _crash_report(text: str) -> str:
    """faulthandler's report of a crash in native code (SIGSEGV, SIGABRT...), or ``""``.

    Every worker of a launch enables it (``worker_site``): the report gives each Python thread's
    stack, innermost first, then a long list of extension modules, left out here.
    """
    start = text.rfind("Fatal Python error:")
    if start < 0:
        return ""
    lines = text[start:].splitlines()
    return "\n".join(line for line in lines if not line.startswith("Extension modules:")).rstrip()


def crash_location(report: str, script: str | os.PathLike) -> str:
    """The line of ``script`` a faulthandler crash report points at, said for a person, or ``""``.

    The report lists every Python thread; the one that crashed is marked "Current thread". When
    that thread has no frame in the script (a helper thread, or C++ with no Python frame), the
    line the script itself was on is still worth giving, said as such.
    """
    current = next((block for block in report.split("\n\n")
                    if block.lstrip().startswith("Current thread")), "")
    frame = stacks.innermost_in(current, script)
    if frame:
        return f"It crashed at {frame.describe()}"
    frame = stacks.innermost_in(report, script)
    return (f"It crashed outside the script's own frames, while the script was at "
            f"{frame.describe()}" if frame else "")


def _traceback(text: str) -> str:
    start = text.rfind("Traceback (most recent call last)")
    return text[start:] if start >= 0 else ""


def _exit_description(exitcode: int | None) -> str:
    if exitcode is None:  # it raised, but torchrun stopped the job before it exited itself
        return "raised (torchrun's report has no exit code for it)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (out of memory, or killed by hand?)" if name == "SIGKILL" else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {exitcode}"


def failure_message(result: LaunchResult, rank: int | None, exitcode: int | None) -> str:
    who = f"Rank {rank}" if rank is not None else "torchrun"
    raised = raised_errors(result).get(rank) if rank is not None else None
    text = result.output(rank if rank is not None else AGENT, stream="stderr")
    crash = _crash_report(text)
    tb = (raised.traceback.rstrip() if raised else
          crash or _traceback(text) or "\n".join(text.splitlines()[-15:]))
    parts = [f"{who} {_exit_description(exitcode)} while running {result.script.name} "
             f"(launch ended after {result.wall_time:.1f} s)."]
    where = crash_location(crash, result.script) if crash and not raised else ""
    if where:
        parts.append(where)
    if tb:
        parts.append(f"Its error output:\n{_indent(tb)}")
    others = [f"rank {other}: {last_error(result, other)}" for other in result.ranks()
              if other != rank and last_error(result, other)]
    # A rank killed from outside (SIGTERM is torchrun stopping the rest) printed no error.
    report = result.output(AGENT)
    others += [f"rank {other}: {_exit_description(code)}"
               for other, code in _reported_exitcodes(report).items()
               if other != rank and code < 0 and code != -signal.SIGTERM
               and not last_error(result, other)]
    if others:
        parts.append("Other ranks that failed (their last error line):\n"
                     + _indent("\n".join(others)))
    parts.append(f"All output: result.output(); torchrun's logs: {result.run_dir / 'torchrun'}")
    return "\n".join(parts)


def timeout_message(result: LaunchResult, timeout: float) -> str:
    parts = [f"{result.script.name} did not finish within timeout={timeout:g} s; torchrun and "
             "all its workers were stopped."]
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


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
