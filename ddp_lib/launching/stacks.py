"""Where a hung rank was, such as ``train.py:57  dist.all_reduce(t)``: the innermost frame of the
learner's script in the stacks ``faulthandler`` wrote (``worker_site``) on a timeout or interrupt.
"""

from __future__ import annotations

import linecache
import os
import re
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "DDP_WORKSHOP_STACKS"
_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<function>.+)$')


@dataclass(frozen=True)
class Frame:
    """One frame of a stack: file, line number and function, innermost first in a stack."""

    file: str
    line: int
    function: str

    def code(self) -> str:
        """The source line, stripped ('' where the file cannot be read)."""
        return linecache.getline(self.file, self.line).strip()

    def describe(self) -> str:
        return f"{Path(self.file).name}:{self.line}  {self.code()}".rstrip()


def threads(dump: str) -> list[list[Frame]]:
    """Every thread's frames in a faulthandler dump, innermost first, in the dump's order."""
    found: list[list[Frame]] = []
    for line in dump.splitlines():
        frame = _FRAME.match(line)
        if frame:
            if not found:
                found.append([])
            found[-1].append(Frame(frame["file"], int(frame["line"]), frame["function"]))
        elif "most recent call first" in line:
            found.append([])
    return [frames for frames in found if frames]


def innermost_in(dump: str, script: str | os.PathLike) -> Frame | None:
    """The innermost frame of ``script`` in the dump, from the thread deepest in it: the main
    thread, in a collective or a loop, not a helper thread the script started that waits."""
    target = os.path.realpath(script)
    best: tuple[int, Frame] | None = None
    for frames in threads(dump):
        mine = [f for f in frames if os.path.realpath(f.file) == target]
        if mine and (best is None or len(mine) > best[0]):
            best = (len(mine), mine[0])
    return best[1] if best else None


def read(folder: Path) -> dict[int, str]:
    """rank -> that rank's dump, for every rank that wrote one into ``folder``."""
    dumps = {}
    for path in sorted(folder.glob("rank*.txt")) if folder.is_dir() else []:
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip() and path.stem[4:].isdigit():
            dumps[int(path.stem[4:])] = text
    return dict(sorted(dumps.items()))


def where(dumps: dict[int, str], script: str | os.PathLike) -> list[str]:
    """One line per rank: the line of ``script`` it was at, or why that is not known."""
    lines = []
    for rank, dump in dumps.items():
        frame = innermost_in(dump, script)
        lines.append(f"rank {rank}: {frame.describe()}" if frame
                     else f"rank {rank}: not in {Path(script).name} (see its stack)")
    return lines
