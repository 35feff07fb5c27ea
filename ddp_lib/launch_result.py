"""What a launch gives back: the result of a run, and the errors that carry one."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ddp_lib.supervise import Line


class LaunchError(RuntimeError):
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

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def output(self, rank: int | str | None = None, stream: str | None = None) -> str:
        """The text printed by one rank (an int), by ``"torchrun"``, or by all (``None``).

        Args:
            rank: which rank's lines; ``None`` for every line in the order they arrived.
            stream: ``"stdout"`` or ``"stderr"`` only; ``None`` for both.
        """
        source = f"rank{rank}" if isinstance(rank, int) else rank
        return "\n".join(
            line.text if source else f"[{line.source}] {line.text}"
            for line in self.lines
            if (source is None or line.source == source) and stream in (None, line.stream)
        )

    def metric(self, name: str, rank: int = 0) -> list[tuple[int | None, float]]:
        """``(step, value)`` pairs reported under ``name`` by ``rank``, in order."""
        return [(m["step"], m["value"]) for m in self.metrics
                if m["name"] == name and m["rank"] == rank]

    def records(self, name: str, rank: int | None = None) -> list[dict]:
        """Every record reported under ``name`` (by ``rank`` only, if given), in order."""
        return [m for m in self.metrics
                if m["name"] == name and (rank is None or m["rank"] == rank)]

    def fingerprints(self) -> dict[int, str]:
        """rank -> SHA-256 of that rank's final weights, from ``metrics.report_weights``."""
        return {m["rank"]: m["sha256"] for m in self.records("weights_sum")}

    def ranks(self) -> list[int]:
        """The ranks that printed or reported anything."""
        found = {line.rank for line in self.lines if line.rank is not None}
        found.update(m["rank"] for m in self.metrics)
        return sorted(found)
