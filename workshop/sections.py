"""The workshop's sections and exercises: what each teaches to whom, for how long, and the least
time it can honestly take.

A **section** is a markdown cell whose first line is a ``## `` heading, with the cells up to the
next such cell; its ``metadata["ddp_workshop"]`` holds ``{"tier", "audiences", "minutes"}``. An
**exercise** is a markdown cell that starts with ``**N.**``, with its solution cells; its metadata
holds ``{"tier", "minutes"}``. An exercise belongs to the section it ends: the one that teaches
its idea, or the lesson's Exercises section (homework).

A section's minutes may not be below its *floor*: its words at a speaking pace, its code read at a
walking-through pace (a cell whose source is folded away is not read: its output is what the
lesson shows; of a cell that changes a script, the changed lines), and its cells' run time
measured on 2 cores (``RUN_SECONDS``). An exercise's floor is its question read, its solution
written (where the learner starts from a script, ``START``, only the lines the solution adds),
and the solution's run time.

``python -m workshop.sections`` prints every section and exercise with its floor.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import nbformat

from ddp_lib import scripts

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
KEY = "ddp_workshop"
TIERS = {
    "core": "taught in every track, by the learners' own hands where there is code",
    "optional": "taught in the tracks that name it (`workshop/schedule.py`)",
    "homework": "done after the day, from the learners' edition",
    "demo": "the instructor runs it while learners watch",
    "instructor": "notes for the instructor, folded away in the learners' edition",
}
TAUGHT = ("core", "optional", "demo")  # the tiers that take time in a day
AUDIENCES = ("ML", "HPC")
SPEAKING_WORDS_PER_MIN = 130  # a presenter explaining, not a reader skimming
CODE_LINES_PER_MIN = 30  # code walked through on screen: about two seconds a line
WRITTEN_LINES_PER_MIN = 6  # code a learner writes and gets right
# The learners' time, which a room needs beside the floor above (docs/instructors.md, "The
# learners' time", gives the sources): reading, typing and running, and each exercise a multiple
# of its own question and solution.
READING_WORDS_PER_MIN = 100
TYPED_LINES_PER_MIN = 12
SECONDS_PER_CELL = 30  # to run a cell and read what it printed
SHARED_RUN_FACTOR = 1.5  # a run on a node that the room shares
EXERCISE_FACTOR = 1.75  # an exercise against its solution read, typed and run once
RUN_SECONDS = ROOT / "workshop" / "run_seconds.json"
START = "exercise_start"  # a solution's metadata: [lesson, script], the script a learner edits
HEADING = re.compile(r"## (.+)")
EXERCISE = re.compile(r"\*\*(\d+)\.")


@dataclass
class Part:
    """What a section and an exercise share: where it starts, its metadata, what fills it."""

    lines_per_min: ClassVar[int]  # code read (a section) or written (an exercise)
    lesson: str
    cell: int  # index of the markdown cell that starts it
    meta: dict
    words: int = 0
    code_lines: int = 0
    code_cells: int = 0
    run_s: float = 0.0

    @property
    def tier(self) -> str:
        return self.meta.get("tier", "")

    @property
    def minutes(self) -> int:
        return self.meta.get("minutes", 0)

    def floor(self) -> int:
        """The least time it can honestly take: its words, its code and its runs."""
        return math.ceil(self.words / SPEAKING_WORDS_PER_MIN
                         + self.code_lines / self.lines_per_min + self.run_s / 60)

    def learners_time(self) -> float:
        """Minutes a learner takes: its words read, its code typed, each cell run and its output
        read, the runs slower on a shared node."""
        return (self.words / READING_WORDS_PER_MIN + self.code_lines / TYPED_LINES_PER_MIN
                + self.code_cells * SECONDS_PER_CELL / 60 + self.run_s * SHARED_RUN_FACTOR / 60)

    @property
    def room_minutes(self) -> int:
        """What a room needs: the stated minutes, or the learners' time where that is longer."""
        return max(self.minutes, math.ceil(self.learners_time()))


@dataclass
class Exercise(Part):
    lines_per_min: ClassVar[int] = WRITTEN_LINES_PER_MIN
    number: int = 0

    def learners_time(self) -> float:
        """A multiple of its question read and its solution typed and run: a learner tries,
        errs and tries again."""
        return EXERCISE_FACTOR * super().learners_time()


@dataclass
class Section(Part):
    lines_per_min: ClassVar[int] = CODE_LINES_PER_MIN
    title: str = ""
    exercises: list[Exercise] = field(default_factory=list)

    @property
    def audiences(self) -> list[str]:
        return self.meta.get("audiences", [])

    @property
    def number(self) -> str | None:
        """"3" for "3. The main run"; None for an unnumbered section (Key points...)."""
        found = re.match(r"(\d+)\. ", self.title)
        return found[1] if found else None

    def __str__(self) -> str:
        return f"{self.lesson} cell {self.cell} '{self.title}'"


def words(text: str) -> int:
    return len(re.findall(r"[A-Za-z0-9_']+", text))


def lines_of_code(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip() and not line.lstrip()
               .startswith("#"))


def code_to_read(source: str) -> str:
    """The code a walk-through reads in a cell: of a cell that changes a script
    (``%%write_script NEW --from OLD``), the changed lines; their context was read before."""
    first, _, body = source.partition("\n")
    if (scripts.header(first) or (None, None))[1] is None:
        return source
    return "\n".join(line[1:] for line in scripts.changed_lines(body))


def start_text(cell: dict) -> str | None:
    """The script a learner starts this solution from (its ``START`` metadata), or ``None``."""
    start = cell["metadata"].get(START)
    return None if start is None else scripts.cell_text(*start)


def lines_to_write(cell: dict) -> int:
    """A solution's lines of code; for one that starts from a script, only those it adds."""
    start, text = start_text(cell), cell["source"]
    if start is None:
        return lines_of_code(text)
    first, _, body = text.partition("\n")
    written = scripts.script_of(first, body)  # whole, if the cell holds a change to a script
    added = [line[1:] for line in difflib.unified_diff(
        start.splitlines(), written.splitlines(), lineterm="", n=0)
        if line.startswith("+") and not line.startswith("+++")]
    return lines_of_code("\n".join(added))


def run_seconds() -> dict[str, dict[int, float]]:
    """Lesson -> code cell number (nbval's ``Cell N``) -> seconds, as measured."""
    if not RUN_SECONDS.exists():
        return {}
    cells = json.loads(RUN_SECONDS.read_text(encoding="utf-8"))["cells"]
    return {lesson: {int(n): s for n, s in found.items()} for lesson, found in cells.items()}


def read(path: Path, measured: dict[str, dict[int, float]] | None = None) -> list[Section]:
    """The sections of one notebook, with their exercises, words, code and run time."""
    lesson = path.name[:2]
    seconds = (run_seconds() if measured is None else measured).get(lesson, {})
    notebook = nbformat.read(path, as_version=4)
    sections: list[Section] = []
    exercise: Exercise | None = None
    code_number = -1
    for index, cell in enumerate(notebook.cells):
        first = cell.source.split("\n", 1)[0]
        if cell.cell_type == "code":
            code_number += 1
        meta = dict(cell.metadata.get(KEY, {}))
        if cell.cell_type == "markdown" and HEADING.fullmatch(first):
            sections.append(Section(lesson, index, meta, title=HEADING.fullmatch(first)[1]))
            exercise = None
        elif cell.cell_type == "markdown" and EXERCISE.match(cell.source) and sections:
            exercise = Exercise(lesson, index, meta, number=int(EXERCISE.match(cell.source)[1]))
            sections[-1].exercises.append(exercise)
        if not sections:  # the title cell: part of no section
            continue
        if exercise is not None:
            if cell.cell_type == "markdown":
                exercise.words += words(cell.source.split("<details>")[0])
            else:  # a check cell is run, not written
                if "check" not in cell.metadata.get("tags", []):
                    exercise.code_lines += lines_to_write(cell)
                exercise.code_cells += 1
                exercise.run_s += seconds.get(code_number, 0.0)
        elif cell.cell_type == "markdown":
            sections[-1].words += words(cell.source)
        else:
            if not cell.metadata.get("jupyter", {}).get("source_hidden"):  # folded: not read
                sections[-1].code_lines += lines_of_code(code_to_read(cell.source))
            sections[-1].code_cells += 1
            sections[-1].run_s += seconds.get(code_number, 0.0)
    return sections


def all_sections(folder: Path = NOTEBOOKS) -> dict[str, list[Section]]:
    measured = run_seconds()
    return {path.name[:2]: read(path, measured)
            for path in sorted(folder.glob("[0-9][0-9]_*.ipynb"))}


def problems(found: dict[str, list[Section]]) -> list[str]:
    """What is missing or wrong in the sections' metadata, one line each."""
    said = []
    for sections in found.values():
        for section in sections:
            if section.tier not in TIERS:
                said.append(f"{section}: tier {section.tier!r} is not one of {list(TIERS)}")
            if not section.audiences or not set(section.audiences) <= set(AUDIENCES):
                said.append(f"{section}: audiences {section.audiences!r} must be some of "
                            f"{list(AUDIENCES)}")
            if section.tier in TAUGHT and section.minutes < section.floor():
                said.append(f"{section}: {section.minutes} min stated, at least "
                            f"{section.floor()} needed ({section.words} words, "
                            f"{section.code_lines} lines of code, {section.run_s:.0f} s of runs)")
            for exercise in section.exercises:
                where = f"{section.lesson} exercise {exercise.number}"
                if exercise.tier not in ("core", "optional", "homework"):
                    said.append(f"{where}: tier {exercise.tier!r} must be core, optional or "
                                f"homework")
                if exercise.minutes < exercise.floor():
                    said.append(f"{where}: {exercise.minutes} min stated, at least "
                                f"{exercise.floor()} needed ({exercise.words} words, "
                                f"{exercise.code_lines} lines to write, "
                                f"{exercise.run_s:.0f} s of runs)")
    return said


def main() -> int:
    found = all_sections()
    for lesson, sections in found.items():
        for s in sections:
            print(f"{lesson} {s.cell:3d} {s.tier or '?':10s} {s.minutes:3d}/{s.floor():3d} min "
                  f"({s.words:4d} w, {s.code_lines:4d} L, {s.run_s:5.0f} s)  {s.title[:50]}")
            for e in s.exercises:
                print(f"{'':7s}exercise {e.number}: {e.tier or '?':8s} {e.minutes:3d}/"
                      f"{e.floor():3d} min ({e.words} w, {e.code_lines} L, {e.run_s:.0f} s)")
    said = problems(found)
    print("\n".join(said) or "every section and exercise has its tier and enough minutes")
    return 1 if said else 0


if __name__ == "__main__":
    sys.exit(main())
