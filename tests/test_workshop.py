"""The workshop tools: the learners' edition hides every solution, the schedule is current."""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

from workshop import exercises, schedule

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture(scope="module")
def edition(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("exercises") / "notebooks"


@pytest.fixture(scope="module")
def built(edition) -> dict[str, tuple[dict, dict]]:
    """Each lesson's name: (the course's notebook, its learners' edition)."""
    exercises.build(edition.parent)
    return {path.name: (nbformat.read(path, as_version=4),
                        nbformat.read(edition / path.name, as_version=4))
            for path in NOTEBOOKS}


def cell_text(cell: dict) -> str:
    return exercises.source(cell)


def test_every_lesson_has_an_edition(built):
    assert sorted(built) == [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_solution_line_reaches_the_edition(built, path):
    course, learners = built[path.name]
    lesson_text = "\n".join(cell_text(c) for c in course["cells"] if not exercises.is_solution(c))
    edition_text = "\n".join(cell_text(c) for c in learners["cells"])
    for cell in course["cells"]:
        if not exercises.is_solution(cell):
            continue
        for line in cell_text(cell).splitlines():
            line = line.strip()
            if line and line not in lesson_text:  # lines the lesson shows anyway are no leak
                assert line not in edition_text, f"{path.name}: solution line leaked: {line}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stubs_are_python_and_replace_each_solution(built, path):
    course, learners = built[path.name]
    assert len(course["cells"]) == len(learners["cells"])
    for ours, theirs in zip(course["cells"], learners["cells"], strict=True):
        if exercises.is_solution(ours):
            assert exercises.STUB in theirs["metadata"]["tags"]
            assert not exercises.is_solution(theirs)
            ast.parse(cell_text(theirs))
            assert cell_text(theirs).rstrip().endswith("pass"), "the stub does nothing"
        else:
            assert theirs == ours, "every other cell is copied unchanged"
    assert learners["metadata"] == course["metadata"]


def test_a_solution_becomes_a_stub_that_names_its_exercise():
    exercise = {"cell_type": "markdown",
                "source": "**3.** Add two numbers.\n\n<details>x</details>"}
    solution = {"cell_type": "code", "metadata": {"tags": ["solution"]}, "outputs": [],
                "execution_count": 1, "source": "# Solution to exercise 3\nprint(1 + 2)"}
    stub = exercises.stub(solution, exercise)
    assert exercises.source(stub).splitlines() == [
        "# Exercise 3: write your code here, then run the cell.", "#", "# Add two numbers.",
        "pass"]
    assert stub["metadata"]["tags"] == [exercises.STUB]


def test_a_stub_says_which_cells_to_edit_when_the_solution_names_them():
    exercise = {"cell_type": "markdown", "source": "**1.** Remove a line of the script."}
    solution = {"cell_type": "code", "outputs": [], "execution_count": None,
                "metadata": {"tags": ["solution"], "jupyter": {"source_hidden": True},
                             exercises.STUB_INSTRUCTION: "edit section 2's script cell, run it, "
                                                         "then the launch cell of section 4."},
                "source": "# Solution to exercise 1\nprint(1)"}
    stub = exercises.stub(solution, exercise)
    assert exercises.source(stub).splitlines() == [
        "# Exercise 1: edit section 2's script cell, run it, then the launch cell of section 4.",
        "#", "# Remove a line of the script.", "pass"]
    assert stub["metadata"] == {"tags": [exercises.STUB]}, "shown, and nothing left to hide"


def test_minutes_line_matches_the_metadata():
    found = schedule.lessons()
    assert [lesson.number for lesson in found] == [p.name[:2] for p in NOTEBOOKS]
    assert all(lesson.teaching_min > 0 and lesson.exercises_min > 0 for lesson in found)


def test_a_wrong_minutes_line_is_refused(tmp_path):
    notebook = nbformat.read(NOTEBOOKS[0], as_version=4)
    notebook.metadata[schedule.KEY]["teaching_min"] += 5
    nbformat.write(notebook, tmp_path / NOTEBOOKS[0].name)
    with pytest.raises(ValueError, match="disagrees"):
        schedule.lessons(tmp_path)


def test_every_lesson_has_notes_and_run_times():
    numbers = {lesson.number for lesson in schedule.lessons()}
    assert numbers == set(schedule.NOTES) == set(schedule.CPU_SECONDS) == set(schedule.GPU_SECONDS)
    assert all(seconds > 0 for seconds, _ in schedule.CPU_SECONDS.values())


def test_the_committed_schedule_is_current():
    assert schedule.main(["--check"]) == 0, "docs/schedule.md is stale: run make schedule"
