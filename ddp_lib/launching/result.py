"""What a launch gives back: the result of a run, and the errors that carry one."""

from __future__ import annotations

import hashlib
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path

from ddp_lib.launching.records import Report

_LIBRARY = Path(__file__).resolve().parents[1]  # ddp_lib


@dataclass
class Line:
    """One line of output: its source (global ``"rank0"``, or the launcher), stream and node, and
    when the launch read it (``time.time()``; 0 where not known), which orders the ranks' errors."""

    source: str
    stream: str
    text: str
    node: int = 0
    time: float = 0.0

    @property
    def rank(self) -> int | None:
        """The global rank that printed the line; ``None`` for the launcher's own lines."""
        return int(self.source[4:]) if self.source.startswith("rank") else None


class ShortTraceback:
    """Shows the exception in IPython without ddp_lib's frames, which hide the message."""

    def _render_traceback_(self) -> list[str]:
        from IPython import get_ipython

        shell = get_ipython()
        tb = _without_library_frames(self.__traceback__)
        if shell is None:
            return traceback.format_exception(type(self), self, tb)
        return shell.InteractiveTB.structured_traceback(type(self), self, tb)


def _without_library_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    kept = []
    while tb is not None:
        if not Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_LIBRARY):
            kept.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


class LaunchError(ShortTraceback, RuntimeError):
    """A launch that did not end well; ``result`` holds everything that was collected."""

    def __init__(self, message: str, result: LaunchResult):
        super().__init__(message)
        self.result = result


class RankFailed(LaunchError):
    """A worker exited with an error; ``rank`` and ``exitcode`` say which and how."""

    def __init__(self, message: str, result: LaunchResult, rank: int | None, exitcode: int | None):
        super().__init__(message, result)
        self.rank = rank
        self.exitcode = exitcode


class LaunchTimeout(LaunchError):
    """The launch ran past its ``timeout`` and was stopped."""


class LaunchInterrupted(ShortTraceback, KeyboardInterrupt):
    """The cell was interrupted during a launch; every process of it was stopped first."""

    def _render_traceback_(self) -> list[str]:
        """The message first: whoever pressed stop reads what stopped, then the cell's frames."""
        shown = super()._render_traceback_()
        return shown[-1:] + shown[:-1]


class StaleResult(ShortTraceback, RuntimeError):
    """A result whose script was changed after it was launched (see ``require_current``)."""


def digest(script: Path) -> str:
    """What identifies a script's text: the SHA-256 of the file's bytes."""
    return hashlib.sha256(script.read_bytes()).hexdigest()


@dataclass
class LaunchResult:
    """Everything a finished launch left behind, for the next cell to plot or assert on."""

    script: Path
    command: list[str]
    run_dir: Path
    returncode: int | None = None
    wall_time: float = 0.0
    lines: list[Line] = field(default_factory=list)
    metrics: list[dict] = field(default_factory=list)
    timed_out: bool = False
    stacks: dict[int, str] = field(default_factory=dict)  # rank -> its stacks, if it hung
    script_digest: str = ""  # the script's ``digest`` when it was launched
    failure_report: Report = field(default_factory=lambda: Report({}))  # what the agents recorded
    stopped_at: float | None = None  # when the launch stopped a failing launch (mpiexec's ranks)
    restarted_at: float | None = None  # when torchrun last started the workers anew

    def last_attempt(self, source: str | None = None, stream: str | None = None) -> list[Line]:
        """The lines since torchrun last restarted the workers (all, if it never did); only
        ``source``'s (``"rank0"``, ``"torchrun"``) and ``stream``'s, if given."""
        since = self.restarted_at or 0.0
        return [line for line in self.lines if (not line.time or line.time >= since)
                and source in (None, line.source) and stream in (None, line.stream)]

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def require_current(self) -> None:
        """Refuse a result from before the script was edited: a check would judge the old script.

        Raises:
            StaleResult: the script file was changed (or removed) after this launch.
        """
        if not self.script.is_file() or digest(self.script) != self.script_digest:
            raise StaleResult(
                f"Re-run the launch cell: this result is from before your edit of "
                f"{self.script}, so it cannot show what your edit does.")

    def output(self, rank: int | str | None = None, stream: str | None = None) -> str:
        """The text printed by one rank, by the launcher, or by all.

        Args:
            rank: a rank, ``"torchrun"`` or ``"mpiexec"``; ``None``: every line, in order.
            stream: ``"stdout"`` or ``"stderr"`` only; ``None`` for both.
        """
        source = f"rank{rank}" if isinstance(rank, int) else rank
        return "\n".join(
            line.text if source else f"[{line.source}] {line.text}" for line in self.lines
            if (source is None or line.source == source) and stream in (None, line.stream))

    def metric(self, name: str, rank: int = 0) -> list[tuple[int | None, float]]:
        """``(step, value)`` pairs reported under ``name`` by ``rank``, in order."""
        return [(m["step"], m["value"]) for m in self.metrics
                if m["name"] == name and m["rank"] == rank]

    def records(self, name: str, rank: int | None = None) -> list[dict]:
        """Every record reported under ``name`` (by ``rank`` only, if given), in order."""
        return [m for m in self.metrics
                if m["name"] == name and (rank is None or m["rank"] == rank)]

    def fingerprints(self) -> dict[int, str]:
        """rank -> SHA-256 of that rank's final weights, from ``course_helpers.report_weights``."""
        return {m["rank"]: m["sha256"] for m in self.records("weights_sum")}

    def ranks(self) -> list[int]:
        """The ranks that printed or reported anything."""
        found = {line.rank for line in self.lines if line.rank is not None}
        found.update(m["rank"] for m in self.metrics)
        return sorted(found)
