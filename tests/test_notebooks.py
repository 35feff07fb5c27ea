"""Every notebook is a lesson with the course's shape, and is committed without outputs.

nbval runs the notebooks themselves (see the Makefile's test target); these checks read them.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from workshop.exercises import leaning_on_solutions, names

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
KEEP_OUTPUT = "nbval-check-output"
SOLUTION = "solution"
# A question answered by reasoning alone says so in its folded solution's summary.
THOUGHT = "<details><summary>Solution (a question to think through: no code to run)</summary>"
EXERCISE = re.compile(r"^\*\*(\d+)\.", re.MULTILINE)


def cells(path: Path) -> list[dict]:
    return nbformat.read(path, as_version=4).cells


def text(cell: dict) -> str:
    return cell["source"]


def test_the_series_starts_with_set_up():
    assert [p.name for p in NOTEBOOKS][:2] == ["00_setup.ipynb", "01_single_device.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    for i, cell in enumerate(cells(path)):
        if cell["cell_type"] != "code" or KEEP_OUTPUT in cell.get("metadata", {}).get("tags", []):
            continue
        assert not cell.get("outputs"), f"{path.name} cell {i} carries outputs: strip them"
        assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_cells_that_keep_their_output_have_one(path):
    # nbval compares a tagged cell with its stored output only if the stored cell was run: a tag
    # on a cell without an execution count or without output checks nothing.
    for i, cell in enumerate(cells(path)):
        if KEEP_OUTPUT in cell.get("metadata", {}).get("tags", []):
            assert cell.get("outputs") and cell.get("execution_count") is not None, \
                f"{path.name} cell {i} is tagged {KEEP_OUTPUT} but stores no output to compare"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_has_the_shape_of_a_lesson(path):
    all_cells = cells(path)
    first = text(all_cells[0])
    assert first.startswith("# "), "the first cell is the lesson's title"
    markdown = "\n".join(text(c) for c in all_cells if c["cell_type"] == "markdown")
    for section in ("What you will learn", "Prerequisites", "Key points", "Exercises"):
        assert section in markdown, f"{path.name} has no '{section}'"


def exercises(path: Path) -> dict[int, str]:
    """Each exercise's number and how it is answered: "code", "thought" or "prose".

    The convention: an exercise is a Markdown cell that starts a line with its bold number
    (`**2.**`), one exercise per cell, numbered in the lesson's order: at the end of the section
    that teaches its idea, or in the Exercises section. Its solution is the code cell right
    after it, tagged `solution` (the explanation may stay in the exercise's cell, folded); a
    question that needs no code says so with the THOUGHT summary instead.
    """
    all_cells = cells(path)
    found: dict[int, str] = {}
    for i, cell in enumerate(all_cells):
        if cell["cell_type"] != "markdown":
            continue
        numbers = [int(n) for n in EXERCISE.findall(text(cell))]
        assert len(numbers) <= 1, f"{path.name} cell {i} holds exercises {numbers}: one per cell"
        if not numbers:
            continue
        after = all_cells[i + 1] if i + 1 < len(all_cells) else {}
        if SOLUTION in after.get("metadata", {}).get("tags", []):
            found[numbers[0]] = "code"
        elif THOUGHT in text(cell):
            found[numbers[0]] = "thought"
        else:
            found[numbers[0]] = "prose"
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_is_followed_by_its_solution(path):
    found = exercises(path)
    assert list(found) == list(range(1, len(found) + 1)), f"{path.name} numbers {list(found)}"
    prose = {n for n, kind in found.items() if kind == "prose"}
    assert not prose, (f"{path.name}: exercises {sorted(prose)} have neither a `solution` cell "
                       "nor the 'no code to run' summary")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_solution_cell_follows_an_exercise(path):
    all_cells = cells(path)
    for i, cell in enumerate(all_cells):
        if SOLUTION in cell.get("metadata", {}).get("tags", []):
            assert cell["cell_type"] == "code", f"{path.name} cell {i}"
            before = text(all_cells[i - 1])
            assert EXERCISE.search(before), f"{path.name} cell {i} follows no exercise"
            starts_from_a_script = "exercise_start" in cell["metadata"]  # its stub: the script
            assert text(cell).startswith(
                "%%write_script " if starts_from_a_script else "# Solution to exercise "), (
                f"{path.name} cell {i}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_with_code_has_a_check_under_its_solution(path):
    """A learner's answer is judged where it is written: the cell after a solution is a check
    (``workshop.checks``) that reads the names the stub leaves ``...``, or the script the
    learner edits."""
    all_cells = cells(path)
    for i, cell in enumerate(all_cells):
        if SOLUTION not in cell.get("metadata", {}).get("tags", []):
            continue
        asked = text(all_cells[i - 1])
        after = all_cells[i + 1] if i + 1 < len(all_cells) else {"metadata": {}}
        assert "check" in after["metadata"].get("tags", []), (
            f"{path.name}: {text(cell).splitlines()[0]} has no check under it")
        check = text(after)
        assert "checks." in check, f"{path.name}: the check after cell {i} calls no check"
        for name in cell["metadata"].get("exercise_answers", []):
            assert re.search(rf"\b{name}\b", check), (path.name, name, "not checked")
            assert f"`{name}`" in asked, (path.name, name, "not named in the question")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_lesson_code_reads_nothing_a_solution_set(path):
    """Exercises sit where their idea is taught, so lesson code runs after solutions; in the
    learners' edition each solution is a stub that sets nothing, so no lesson cell may read
    what a solution set. The course's own run (nbval, JupyterLab) then covers the edition too;
    the ml edition's Run All in JupyterLab runs the stubs themselves.
    """
    assert not leaning_on_solutions(nbformat.read(path, as_version=4)), path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_solution_reads_nothing_defined_below_it(path):
    """An exercise sits in the section that teaches its idea, above the lesson's later cells:
    its solution may use only what the cells above it define."""
    code = [cell for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]
    found = [names(cell.source) for cell in code]
    for index, cell in enumerate(code):
        if SOLUTION not in cell.metadata.get("tags", []):
            continue
        above = set().union(*(defined for defined, _ in found[:index]))
        below = set().union(*(defined for defined, _ in found[index + 1:]))
        defined, used = found[index]
        early = (used - defined - above) & below
        assert not early, f"{path.name}: {cell.source.splitlines()[0]} reads {sorted(early)}"


def test_a_lesson_cell_reading_a_solutions_name_is_named():
    course = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("n = 2"),
        nbformat.v4.new_code_cell("# Solution to exercise 1\nn, total = 3, 6",
                                  metadata={"tags": [SOLUTION]}),
        nbformat.v4.new_code_cell("checks.sum_to(total)", metadata={"tags": ["check"]}),
        nbformat.v4.new_code_cell("print(n * 2)"),
        nbformat.v4.new_code_cell("n = 4\nprint(n)"),
    ])
    assert leaning_on_solutions(course) == [
        "cell 3 reads n, last set by '# Solution to exercise 1'"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_solution_cells_are_collapsed(path):
    for cell in cells(path):
        if "solution" in cell.get("metadata", {}).get("tags", []):
            assert cell["metadata"].get("jupyter", {}).get("source_hidden") is True


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_its_own_id(path):
    """nbformat 4.5 needs one per cell; without it nbformat warns and JupyterLab invents one."""
    found = [cell.get("id") for cell in cells(path)]
    assert None not in found, f"{path.name}: cell {found.index(None)} has no id"
    assert len(set(found)) == len(found), f"{path.name}: repeated cell ids"
