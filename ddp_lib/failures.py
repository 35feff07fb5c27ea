"""Each rank's failure as torchrun's agent knows it, kept as data for the launch to read.

When workers fail, torchrun's agent raises ``ChildFailedError``: its ``failures`` map each failed
rank (global) to a ``ProcessFailure``, with the exit code (negative: the signal that killed it),
the pid, the local rank, the error file the rank wrote (``@record``, or a launch's
``sitecustomize``) with the exception and traceback read from it, and a time in whole seconds.
torchrun prints them as its report, for a person; ``python -m ddp_lib.agent`` also writes them
here, as JSON, and ``read`` gives them back to the launch. So does a command line torchrun
refused: its argument parser's complaint.

Each agent of a launch writes its own file, in its log folder, which every launch empties first.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "DDP_WORKSHOP_FAILURES"  # the file an agent writes, set by the launch
FILE_NAME = "failures.json"


@dataclass(frozen=True)
class Failure:
    """One rank's failure, as torchrun's ``ProcessFailure`` gives it."""

    rank: int
    local_rank: int
    pid: int
    exitcode: int  # negative: killed by that signal
    # torchrun's, to the second: when the rank raised (its error file), else when the agent noticed
    timestamp: int
    message: str | None = None  # the uncaught exception ("ValueError: ..."), from its error file
    traceback: str = ""
    raised_at: float | None = None  # when the error file was written: orders ranks within a second


@dataclass(frozen=True)
class Report:
    """What the agents of one launch recorded: failed ranks, or the command line they refused."""

    failures: dict[int, Failure]  # in torchrun's order, agent after agent
    refused: str | None = None


def from_torch(rank: int, failure) -> Failure:
    """Our record of torchrun's ``ProcessFailure`` for global rank ``rank``.

    torch read the error file (when there is one) into ``error_file_data``: ``@record``'s format
    holds the exception and the traceback under ``message``; a bare string is only a message.
    """
    written = os.path.isfile(failure.error_file)
    message = failure.error_file_data.get("message") if written else None
    if isinstance(message, dict):
        message, traceback = message.get("message"), message.get("extraInfo", {}).get(
            "py_callstack", "")
    else:
        traceback = ""
    return Failure(rank=rank, local_rank=failure.local_rank, pid=failure.pid,
                   exitcode=failure.exitcode, timestamp=failure.timestamp,
                   message=message, traceback=traceback,
                   raised_at=os.path.getmtime(failure.error_file) if written else None)


def record(path: str | os.PathLike, failed) -> None:
    """Write ``failed.failures`` (a ``ChildFailedError``'s) to ``path``."""
    failures = [dataclasses.asdict(from_torch(rank, failure))
                for rank, failure in failed.failures.items()]
    _write(path, {"failures": failures})


def record_refusal(path: str | os.PathLike, complaint: str) -> None:
    """Write why torchrun's argument parser refused the command line to ``path``."""
    _write(path, {"refused": complaint})


def _write(path: str | os.PathLike, content: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(content, indent=1), encoding="utf-8")


def path(run_dir: Path, logs: str) -> Path:
    """Where the agent whose log folder is ``run_dir / logs`` records its failures."""
    return run_dir / logs / FILE_NAME


def read(run_dir: Path) -> Report:
    """What every agent of the launch in ``run_dir`` recorded (nothing if all went well)."""
    failures: dict[int, Failure] = {}
    refused = None
    for recorded in sorted(run_dir.glob(f"*/{FILE_NAME}")):
        content = json.loads(recorded.read_text(encoding="utf-8"))
        failures.update((f["rank"], Failure(**f)) for f in content.get("failures", []))
        refused = refused or content.get("refused")
    return Report(failures, refused)
