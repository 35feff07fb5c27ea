"""What a launch that ended badly says: which rank failed and how, or that torchrun itself did.

The root cause is the rank that raised first (its error file, ``records``), passing over ranks
that only lost a peer (Gloo's "Connection closed by peer"). If every rank that raised only lost a
peer, it is a rank killed by a signal (by hand, or out of memory), which left no file; SIGTERM is
torchrun stopping the rest. Without error files (a rank waiting in NCCL raises nothing), it is
torchrun's first failure, to the second, and each rank's last printed error line stands in.
"""

from __future__ import annotations

import os
import re
import shlex
import signal

from ddp_lib.launching import records, stacks
from ddp_lib.launching.records import Failure
from ddp_lib.launching.result import LaunchResult

# What a rank raises when a peer's process went away first: a consequence, not a cause.
PEER_GONE = re.compile(r"Connection (closed|reset) by peer", re.IGNORECASE)


def raised_errors(result: LaunchResult) -> dict[int, Failure]:
    """rank -> its failure, for every rank that failed with an uncaught exception."""
    return {rank: failure for rank, failure in result.failure_report.failures.items()
            if failure.message is not None}


def root_cause(result: LaunchResult) -> tuple[int | None, int | None]:
    """The rank whose failure ended the launch and its exit code (``None``: not reported)."""
    failed = result.failure_report.failures
    raised = sorted((f for f in failed.values() if f.message is not None),
                    key=lambda f: f.raised_at)
    causes = [f for f in raised if not PEER_GONE.search(f.message)]
    if causes:
        return causes[0].rank, causes[0].exitcode
    if raised:
        # A SIGTERM is torchrun stopping the rest: a rank killed otherwise comes first.
        killed = sorted((f.exitcode == -signal.SIGTERM, f.rank) for f in failed.values()
                        if f.exitcode < 0 and f.message is None)
        if killed:
            return killed[0][1], failed[killed[0][1]].exitcode
        first = raised[0]
    elif failed:
        # torchrun's own choice (ChildFailedError.get_first_failure): the earliest, to the second.
        first = min(failed.values(), key=lambda f: f.timestamp)
        others = [f for f in failed.values() if f.exitcode != -signal.SIGTERM]
        if first.exitcode == -signal.SIGTERM and others:
            # Without error files, a rank torchrun stopped can tie with the one that died.
            first = min(others, key=lambda f: f.rank)
            return first.rank, first.exitcode
    else:
        return None, result.returncode
    if PEER_GONE.search(last_error(result, first.rank)):
        # A rank stopped before it exited is in no record (torch 2.4); its traceback still says.
        for other in result.ranks():
            error = last_error(result, other)
            if other != first.rank and error and not PEER_GONE.search(error):
                return other, failed[other].exitcode if other in failed else None
    return first.rank, first.exitcode


def last_error(result: LaunchResult, rank: int) -> str:
    """``rank``'s uncaught exception: from its error file, else its last traceback's last line."""
    raised = raised_errors(result).get(rank)
    if raised:
        return raised.message
    lines = _traceback(result.output(rank, stream="stderr")).strip().splitlines()
    return lines[-1].strip() if lines else ""


def refusal(result: LaunchResult) -> str | None:
    """torchrun's own complaint about its command line, if that is why no worker ran."""
    return result.failure_report.refused


def refusal_message(result: LaunchResult, complaint: str) -> str:
    import torch

    return (f"torchrun refused its command line, so no worker ran: {complaint}\n"
            f"The command: {shlex.join(result.command)}\n"
            f"The installed torchrun is torch {torch.__version__}'s; `torchrun --help` lists "
            "what it accepts.")


def _crash_report(text: str) -> str:
    """faulthandler's report of a native crash (``worker_site``), without its module list."""
    start = text.rfind("Fatal Python error:")
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
    start = text.rfind("Traceback (most recent call last)")
    return text[start:] if start >= 0 else ""


def _exit_description(exitcode: int | None, raised: bool = False, launcher: str = "") -> str:
    if exitcode is None or (raised and exitcode == -signal.SIGTERM):  # a peer exited first
        return f"raised an exception, and {launcher} stopped it before it exited,"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (out of memory, or killed by hand?)" if name == "SIGKILL" else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {exitcode}"


def failure_message(result: LaunchResult, rank: int | None, exitcode: int | None) -> str:
    launcher = _launcher(result)
    who = f"Rank {rank}" if rank is not None else launcher
    if rank is None and launcher == "mpiexec":
        signal_number = records.mpiexec_signal(
            [line.text for line in result.lines if line.rank is None])
        if signal_number:  # mpiexec says which signal, not which rank (see records)
            who, exitcode = "A rank (mpiexec does not say which)", -signal_number
    raised = raised_errors(result).get(rank) if rank is not None else None
    text = result.output(rank if rank is not None else launcher, stream="stderr")
    crash = _crash_report(text)
    tb = (raised.traceback.rstrip() if raised and raised.traceback else
          crash or _traceback(text) or "\n".join(text.splitlines()[-15:]))
    parts = [f"{who} {_exit_description(exitcode, bool(raised), launcher)} while running "
             f"{result.script.name} (launch ended after {result.wall_time:.1f} s)."]
    where = crash_location(crash, result.script) if crash and not raised else ""
    if where:
        parts.append(where)
    if tb:
        parts.append(f"Its error output:\n{_indent(tb)}")
    failed = result.failure_report.failures
    errors = {other: last_error(result, other)
              for other in sorted({*result.ranks(), *failed}) if other != rank}
    others = [f"rank {other}: {error}" for other, error in errors.items() if error]
    # A rank killed from outside (SIGTERM is torchrun stopping the rest) printed no error.
    others += [f"rank {other}: {_exit_description(failed[other].exitcode)}"
               for other, error in errors.items() if not error and other in failed
               and failed[other].exitcode < 0 and failed[other].exitcode != -signal.SIGTERM]
    if others:
        parts.append("Other ranks that failed (their last error line):\n"
                     + _indent("\n".join(others)))
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
