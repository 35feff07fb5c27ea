"""Each rank's failure as torchrun's agent knows it, kept as data for the launch to read.

``python -m ddp_lib.launching.torchrun_main`` writes each failed rank's ``ProcessFailure`` (or
the refused command line) as JSON in its log folder: its exit code or signal, and the exception
that ``@record`` wrote to its error file, if the script has it. For mpiexec, ``record_mpiexec``
does what it can: MPICH names the signal that killed a rank but not the rank (only faulthandler's
report tells, and SIGKILL has none).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "DDP_WORKSHOP_FAILURES"  # the file an agent writes, set by the launch
FILE_NAME = "failures.json"


@dataclass(frozen=True)
class Failure:
    """One rank's failure, as torchrun's ``ProcessFailure`` gives it."""

    rank: int
    local_rank: int | None  # None: not known (mpiexec)
    pid: int | None
    exitcode: int  # negative: killed by that signal
    timestamp: int  # torchrun's, in seconds: when the rank raised, else when the agent noticed
    message: str | None = None  # the uncaught exception ("ValueError: ..."), from its error file
    traceback: str = ""
    raised_at: float | None = None  # when the error file was written: to the millisecond


@dataclass(frozen=True)
class Report:
    """What the agents of one launch recorded: failed ranks, or the command line they refused."""

    failures: dict[int, Failure]  # in torchrun's order, agent after agent
    refused: str | None = None


def from_torch(rank: int, failure) -> Failure:
    """Our record of torchrun's ``ProcessFailure`` for global rank ``rank``."""
    written = os.path.isfile(failure.error_file)
    message, traceback = _exception(failure.error_file_data if written else {})
    return Failure(rank=rank, local_rank=failure.local_rank, pid=failure.pid,
                   exitcode=failure.exitcode, timestamp=failure.timestamp,
                   message=message, traceback=traceback,
                   raised_at=os.path.getmtime(failure.error_file) if written else None)


def _exception(error_file_data: dict) -> tuple[str | None, str]:
    """The exception and traceback in an error file (``@record``'s form, or a bare message)."""
    message = error_file_data.get("message")
    if isinstance(message, dict):
        return message.get("message"), message.get("extraInfo", {}).get("py_callstack", "")
    return message, ""


_MPICH_SIGNAL = re.compile(r"EXIT STRING: .*\(signal (\d+)\)")


def mpiexec_signal(launcher_lines: list[str]) -> int | None:
    """The signal that killed a rank, from MPICH's report among mpiexec's lines; else ``None``."""
    found = _MPICH_SIGNAL.search("\n".join(launcher_lines))
    return int(found.group(1)) if found else None


def record_mpiexec(path: str | os.PathLike, launcher_lines: list[str], crashed: list[int]) -> None:
    """Write to ``path``, in the form torchrun's are kept, the one rank MPICH reports killed by a
    signal, when one rank alone printed faulthandler's report (``crashed``); MPICH keeps no other
    record of its ranks: their exceptions are in their output."""
    signal_number = mpiexec_signal(launcher_lines)
    if signal_number and len(crashed) == 1:
        failure = Failure(rank=crashed[0], local_rank=None, pid=None, exitcode=-signal_number,
                          timestamp=int(time.time()))
        _write(path, {"failures": [dataclasses.asdict(failure)]})


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
