"""What a launch that ended badly says: which rank failed and how, or that torchrun itself did.

The root cause is read from torchrun's failure report (``Root Cause (first observed failure)``,
with the rank and exit code), which torchrun prints for every failed worker, whether or not the
script's entry point is wrapped in ``@record``.
"""

from __future__ import annotations

import re
import shlex
import signal
from typing import TYPE_CHECKING

from ddp_lib.supervise import AGENT

if TYPE_CHECKING:
    from ddp_lib.launch import LaunchResult

_ROOT_CAUSE = re.compile(
    r"Root Cause.*?rank\s*:\s*(-?\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)


def root_cause(result: LaunchResult) -> tuple[int | None, int | None]:
    """The first rank that failed and its exit code, from torchrun's failure report."""
    match = _ROOT_CAUSE.search(result.output(AGENT))
    if not match:
        return None, result.returncode
    return int(match.group(1)), int(match.group(2))


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


def failure_message(result: LaunchResult, rank: int | None, exitcode: int | None) -> str:
    who = f"Rank {rank}" if rank is not None else "torchrun"
    text = result.output(rank if rank is not None else AGENT, stream="stderr")
    tb = _traceback(text) or "\n".join(text.splitlines()[-15:])
    parts = [f"{who} {_exit_description(exitcode)} while running {result.script.name} "
             f"(launch ended after {result.wall_time:.1f} s)."]
    if tb:
        parts.append(f"Its error output:\n{_indent(tb)}")
    parts.append(f"All output: result.output(); torchrun's logs: {result.run_dir / 'torchrun'}")
    return "\n".join(parts)


def timeout_message(result: LaunchResult, timeout: float) -> str:
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
