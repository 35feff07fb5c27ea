"""Write the learners' edition: every notebook with its solution cells replaced by stubs.

A solution is a code cell tagged ``solution`` right after its exercise (tests/test_notebooks.py
states the convention). In the edition that cell becomes a stub tagged ``exercise-stub``: a
comment that says what to write, then ``pass`` (or, where a check reads named answers,
``name = ...`` for each), valid Python that does nothing and shows nothing
(``...`` would print ``Ellipsis`` under Run All), so that a learner can run the whole notebook
before solving anything. A cell tagged ``check`` (``workshop.checks``) is no solution: it stays,
tagged ``raises-exception`` too, so that the mistakes it names in a learner's code do not stop
Run All. Every other cell is copied unchanged, and the
notebooks keep their folder name, so that relative paths (``scripts/``, another lesson's
notebook) and ``ddp_lib`` on ``PYTHONPATH`` resolve as they do in the course itself.

A **track's edition** (``--track ml``, a track of ``workshop.schedule``) keeps, in each
notebook, the sections and exercises the track teaches, in order, and moves the rest to an
appendix at the notebook's end, their code cells made raw cells: Run All runs what the day
teaches and nothing else, and the rest is still there to read, or to run one cell at a time
(a raw cell becomes code with the Y key).

``python -m workshop.exercises [DEST] [--track NAME]`` writes DEST/notebooks/ (default
build/exercises, or build/exercises-NAME for a track).
"""

from __future__ import annotations

import argparse
import ast
import copy
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ddp_lib import scripts
from workshop import schedule, sections

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = "solution"
STUB = "exercise-stub"
CHECK = "check"  # an exercise's check: it runs the learner's code, and stays in the edition
ANSWERS = "exercise_answers"  # a solution's metadata: the names its check reads, left ... in a stub
STUB_INSTRUCTION = "exercise_stub"  # a solution cell's metadata: what its stub tells to do
# A solution's metadata, with sections.START: the numbered steps its stub marks in the script, as
# [line, where ("before" or "after"), what to do]: a faded start, the steps in place.
TODOS = "exercise_todos"
DEFAULT_INSTRUCTION = "write your code here, then run the cell."
HEADER = re.compile(r"^# Solution to exercise (\d+)(?::\s*(.*))?")


def is_solution(cell: dict) -> bool:
    return SOLUTION in cell.get("metadata", {}).get("tags", [])


def source(cell: dict) -> str:
    text = cell["source"]
    return text if isinstance(text, str) else "".join(text)  # nbformat: str; raw JSON: lines


def names(code: str) -> tuple[set[str], set[str]]:
    """The names a cell's code defines and the names it reads (``%magics`` read as the calls
    IPython makes of them)."""
    from IPython.core.inputtransformer2 import TransformerManager

    defined, used = set(), set()
    for node in ast.walk(ast.parse(TransformerManager().transform_cell(code))):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return defined, used


def leaning_on_solutions(notebook: dict) -> list[str]:
    """The lesson cells that read a name whose value a solution set: one line each.

    An exercise sits in the section that teaches its idea, so lesson code follows solutions.
    In the learners' edition a solution is a stub that defines nothing, so a lesson cell may
    read no name whose last writer, when the course runs top to bottom, is a solution.
    """
    written_by: dict[str, str] = {}  # name -> "lesson" or the solution's first line
    said = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        defined, used = names(source(cell))
        if is_solution(cell):
            written_by |= dict.fromkeys(defined, source(cell).partition("\n")[0])
            continue
        if CHECK not in cell["metadata"].get("tags", []):  # a check reads the answers
            leaning = sorted(n for n in used - defined if written_by.get(n, "lesson") != "lesson")
            said += [f"cell {index} reads {name}, last set by '{written_by[name]}'"
                     for name in leaning]
        written_by |= dict.fromkeys(defined, "lesson")
    return said


def stub(solution: dict, exercise: dict) -> dict:
    """The cell a learner fills in: which exercise, what to do where, what it asks, then ``pass``.

    What to do is "write your code here" unless the solution's metadata says otherwise under
    ``STUB_INSTRUCTION``: an exercise that is done by editing another cell (a script) names that
    cell and the cells to run after it, since this one stays empty. A solution that starts from
    a lesson's script (``sections.START``) has that script as its stub, under the solution's name:
    the exercise's text says what to change.
    """
    start = sections.start_text(solution)
    if start is not None:
        steps = solution["metadata"].get(TODOS, [])
        name, _ = scripts.header(source(solution).partition("\n")[0])  # the whole script
        lines = [f"{scripts.MAGIC} {name}", faded(start, steps).rstrip("\n")]
    else:
        match = HEADER.match(source(solution))
        number = match[1] if match else "?"
        asked = re.sub(r"^\*\*\d+\.\*\*\s*|^\*\*\d+\.\s*", "",
                       source(exercise).split("<details>")[0].strip())
        instruction = solution["metadata"].get(STUB_INSTRUCTION, DEFAULT_INSTRUCTION)
        lines = [f"# {line}" for line in _wrap(f"Exercise {number}: {instruction}", 96)]
        lines += ["#"] + [f"# {line}" for line in question(asked)]
        answers = solution["metadata"].get(ANSWERS, [])  # names the check under it reads
        lines += [f"{name} = ..." for name in answers] or ["pass"]
    cell = copy.deepcopy(solution)
    cell["metadata"]["tags"] = [STUB if tag == SOLUTION else tag
                                for tag in cell["metadata"]["tags"] if tag != "nbval-check-output"]
    cell["metadata"].pop("jupyter", None)  # a stub is meant to be seen
    for key in (STUB_INSTRUCTION, sections.START, ANSWERS, TODOS):
        cell["metadata"].pop(key, None)
    cell["source"] = "\n".join(lines)
    cell["outputs"], cell["execution_count"] = [], None
    return cell


FENCED = re.compile(r"```\w*\n(.*?)```", re.S)


def question(text: str, width: int = 96) -> list[str]:
    """An exercise's question as a stub's comment lines: its prose wrapped, a code block it
    shows kept line for line, indented, so that it reads (and copies) as code."""
    lines: list[str] = []
    for number, part in enumerate(FENCED.split(text)):
        if number % 2:  # a code block
            lines += [f"    {line}".rstrip() for line in part.rstrip("\n").split("\n")]
        else:
            lines += _wrap(re.sub(r"\s+", " ", part).strip(), width)
    return lines


def faded(script: str, steps: list[list[str]]) -> str:
    """The script with each step as a ``# TODO n:`` comment, indented as the line it goes
    before or after (the first line that is, stripped, that line)."""
    lines = script.split("\n")
    for number, (anchor, where, todo) in reversed(list(enumerate(steps, 1))):
        at = next((i for i, line in enumerate(lines) if line.strip() == anchor), None)
        if at is None:
            raise ValueError(f"TODO {number}: no line {anchor!r} in the script")
        indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
        wrapped = _wrap(f"TODO {number}: {todo}", 96 - len(indent))
        comment = [f"{indent}# {wrapped[0]}"] + [f"{indent}#   {line}" for line in wrapped[1:]]
        lines[at + (where == "after"):at + (where == "after")] = comment
    return "\n".join(lines)


def _wrap(text: str, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return lines + ([line] if line else [])


def edition(notebook: dict) -> dict:
    """A copy of a notebook with each solution cell replaced by its stub, and the instructor's
    notes folded away (a section of tier ``instructor``: shown as one collapsed line)."""
    learners = copy.deepcopy(notebook)
    cells = learners["cells"]
    instructor = False
    for i, cell in enumerate(cells):
        tier = cell.get("metadata", {}).get(sections.KEY, {}).get("tier")
        if cell["cell_type"] == "markdown" and sections.HEADING.fullmatch(
                source(cell).split("\n", 1)[0]):
            instructor = tier == "instructor"
        if is_solution(cell):
            cells[i] = stub(cell, cells[i - 1])
        elif CHECK in cell.get("metadata", {}).get("tags", []):
            # Jupyter's convention: an error here does not stop Run All, nor the cells after it
            cell["metadata"]["tags"] = [*cell["metadata"]["tags"], "raises-exception"]
        elif instructor:
            cell["metadata"].setdefault("jupyter", {})["source_hidden"] = True
    return learners


@dataclass(frozen=True)
class Taught:
    """What a track teaches of one lesson: which of its sections (by heading cell) and exercises,
    and the lesson's parts as ``workshop.sections`` reads them."""

    track: schedule.Track
    section_cells: frozenset[int]
    exercise_numbers: frozenset[int]
    minutes: int
    parts: tuple[sections.Section, ...]


def taught_by(track: schedule.Track, folder: Path = ROOT / "notebooks") -> dict[str, Taught]:
    """Lesson number -> what the track teaches of it (a lesson it skips maps to nothing taught)."""
    all_lessons = schedule.lessons(folder)
    chosen = schedule.slots(track, all_lessons)
    return {lesson.number: Taught(
        track,
        frozenset(s.section.cell for s in chosen if s.lesson is lesson),
        frozenset(e.number for s in chosen if s.lesson is lesson for e in s.exercises),
        sum(s.minutes for s in chosen if s.lesson is lesson),
        lesson.sections) for lesson in all_lessons}


def cell_parts(taught: Taught, count: int) -> list[tuple[str, int, dict]]:
    """Each of the lesson's ``count`` cells: ("intro", 0, {}) before the first section, else
    ("section", heading cell, metadata) or ("exercise", number, metadata), where each starts."""
    starts = {s.cell: ("section", s.cell, s.meta) for s in taught.parts}
    starts |= {e.cell: ("exercise", e.number, e.meta) for s in taught.parts for e in s.exercises}
    part: tuple[str, int, dict] = ("intro", 0, {})
    found = []
    for index in range(count):
        part = starts.get(index, part)
        found.append(part)
    return found


# "section 3", "sections 2 and 5", "lesson 05's section 4", "lesson 08, sections 2 and 8"
REFERENCE = re.compile(r"(?P<lesson>[Ll]esson (?P<number>\d\d)(?:'s|,)? )?(?P<word>[Ss]ections? )"
                       r"(?P<list>A?\d+(?:(?:, | and | or |, and )A?\d+)*)\b")
# The sections that show a bullet of the objectives or the key points: the course's convention is
# an HTML comment at the bullet's end, invisible where the notebook is rendered.
SHOWN_BY = re.compile(r" ?<!-- sections: ([\w, ]+) -->")


def renumber(text: str, lesson: str, numbers: dict[str, dict[str, str]]) -> str:
    """The text with every reference to a section in the edition's numbers: the lesson's own,
    or the lesson it names. Of a cell that changes a script, only the ``+`` lines: the others
    must match the parent, which is the course's (``scripts.course_script``)."""
    def new(match: re.Match) -> str:
        table = numbers.get(match["number"] or lesson, {})
        listed = re.sub(r"(?<!A)\b\d+", lambda n: table.get(n[0], n[0]), match["list"])
        return f"{match['lesson'] or ''}{match['word']}{listed}"
    first, _, body = text.partition("\n")
    if (scripts.header(first) or (None, None))[1] is None:
        return REFERENCE.sub(new, text)
    return "\n".join([first] + [REFERENCE.sub(new, line) if line.startswith("+") else line
                                for line in body.split("\n")])


def appendix_references(text: str) -> list[str]:
    """The references of an edition's text to its own lesson's appendix (A3), one each."""
    return [match[0] for match in REFERENCE.finditer(text)
            if not match["lesson"] and re.search(r"\bA\d", match["list"])]


def bullets(text: str) -> list[list[str]]:
    """The text in runs of lines: each bullet ("- " and its indented lines) is one run, every
    other line a run of its own."""
    runs: list[list[str]] = []
    for line in text.split("\n"):
        if runs and runs[-1][0].startswith("- ") and line.startswith(" ") and line.strip():
            runs[-1].append(line)
        else:
            runs.append([line])
    return runs


def keep_bullets(text: str, shown: set[str]) -> tuple[str, list[str]]:
    """The objectives' or key points' text without the bullets whose sections are not all kept
    (``<!-- sections: 3, 5 -->``; ``all``: always kept), and those bullets; the markers go."""
    kept, left_out = [], []
    for run in bullets(text):
        marker = SHOWN_BY.search("\n".join(run))
        bullet = SHOWN_BY.sub("", "\n".join(run))
        names = {name.strip() for name in marker[1].split(",")} if marker else {"all"}
        (kept if names <= shown | {"all"} else left_out).append(bullet)
    return "\n".join(kept), left_out


def follow(notebook: dict, taught: Taught, numbers: dict[str, dict[str, str]]) -> dict:
    """The notebook with what the track does not teach moved to an appendix at its end.

    Instructor notes stay where they are (folded). The kept sections are numbered 1, 2, ... and
    every reference to a section says its number in the edition (``numbers``, from
    ``schedule.edition_numbers``). The objectives' and the key points' bullets that a left-out
    section shows move to the appendix too. In the appendix a section's heading becomes a ``###``
    heading, A and its number, that names its tier and minutes, and every code cell becomes a raw
    cell.
    """
    lesson = taught.parts[0].lesson if taught.parts else ""
    own = numbers.get(lesson, {})
    shown = {number for number, label in own.items() if not label.startswith("A")}
    kept, appendix, left_out, bullets_out = [], [], [], []
    cells = notebook["cells"]
    for cell, (kind, key, meta) in zip(cells, cell_parts(taught, len(cells)), strict=True):
        cell = copy.deepcopy(cell)
        text = source(cell)
        heading = sections.HEADING.fullmatch(text.split("\n", 1)[0])
        if cell["cell_type"] == "markdown" and (kind == "intro" or (
                heading and heading[1] == "Key points")):
            text, out = keep_bullets(text, shown)
            bullets_out += out
        text = renumber(text, lesson, numbers)
        number = re.match(r"(\d+)\. ", heading[1]) if heading else None
        title = heading[1][number.end():] if number else heading[1] if heading else ""
        if kind == "intro" or meta.get("tier") == "instructor" or \
                (kind == "section" and key in taught.section_cells) or \
                (kind == "exercise" and key in taught.exercise_numbers):
            if number and cell["cell_type"] == "markdown":
                text = f"## {own[number[1]]}. {title}" + text[len(heading[0]):]
            cell["source"] = text
            kept.append(cell)
            continue
        label = f"{meta.get('tier', '')}, {meta.get('minutes', '?')} min"
        if heading and cell["cell_type"] == "markdown":
            name = f"{own[number[1]]}. {title}" if number else title
            left_out.append(f"{name} ({label})")
            text = f"### {name} · {label}" + text[len(heading[0]):]
        elif kind == "exercise" and cell["cell_type"] == "markdown" and \
                sections.EXERCISE.match(text):
            left_out.append(f"exercise {key} ({label})")
            appendix.append(nbformat.v4.new_markdown_cell(f"### Exercise {key} · {label}",
                                                          id=f"{cell['id']}-title"))
        cell["source"] = text
        if cell["cell_type"] == "code":  # the same id: the edition is the same on every build
            cell = nbformat.v4.new_raw_cell(text, metadata=cell.get("metadata", {}),
                                            id=cell["id"])
        appendix.append(cell)
    title = f"`{taught.track.name}`"  # as make exercises TRACK=... names it
    note = nbformat.v4.new_markdown_cell(
        f"> **The {title} track's edition.** This notebook holds what the {title} track "
        f"teaches of the lesson ({taught.minutes} min with its exercises). The rest of it is in "
        "the appendix at the end, where Run All does not run it.", id="track-edition")
    if not appendix:
        return {**notebook, "cells": [kept[0], note, *kept[1:]]}
    listed = "\n".join(f"- {name}" for name in left_out)
    also = ("\n\nWhat those sections teach, from the lesson's objectives and key points:\n\n"
            + "\n".join(bullets_out)) if bullets_out else ""
    head = nbformat.v4.new_markdown_cell(
        f"## Appendix: not in the {title} track\n\n"
        f"The rest of the lesson, for after the day:\n\n{listed}{also}\n\n"
        "Its code cells are *raw* cells, so that Run All skips them. To run one, select it and "
        "press **Y** (it becomes a code cell), then run it; it needs the appendix's cells above "
        "it, run in order. The whole lesson, every cell runnable, is the full learners' edition "
        "(`make exercises`).", id="track-appendix")
    return {**notebook, "cells": [kept[0], note, *kept[1:], head, *appendix]}


def build(dest: Path, notebooks: Path = ROOT / "notebooks",
          track: schedule.Track | None = None) -> list[Path]:
    """Write the edition of every lesson into dest/notebooks/, the track's when one is given;
    returns the files written."""
    out = dest / "notebooks"
    out.mkdir(parents=True, exist_ok=True)
    plan = taught_by(track, notebooks) if track else {}
    numbers = schedule.edition_numbers(track, schedule.lessons(notebooks)) if track else {}
    written = []
    for path in sorted(notebooks.glob("[0-9][0-9]_*.ipynb")):
        target = out / path.name
        learners = edition(nbformat.read(path, as_version=4))
        if track:
            learners = nbformat.from_dict(follow(learners, plan[path.name[:2]], numbers))
        nbformat.write(learners, target)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", nargs="?", type=Path)
    parser.add_argument("--track", choices=[t.name for t in schedule.TRACKS],
                        help="keep what this track teaches; the rest goes to an appendix")
    args = parser.parse_args(argv)
    track = next((t for t in schedule.TRACKS if t.name == args.track), None)
    dest = args.dest or ROOT / "build" / (f"exercises-{track.name}" if track else "exercises")
    written = build(dest, track=track)
    print(f"wrote {len(written)} notebooks to {dest / 'notebooks'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
