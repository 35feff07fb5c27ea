"""Write the learners' edition: every notebook with its solution cells replaced by stubs.

A solution is a code cell tagged ``solution`` right after its exercise (tests/test_notebooks.py
states the convention). In the edition that cell becomes a stub tagged ``exercise-stub``: a
comment that says what to write, then ``pass``, valid Python that does nothing and shows nothing
(``...`` would print ``Ellipsis`` under Run All), so that a learner can run the whole notebook
before solving anything. Every other cell is copied unchanged, and the
notebooks keep their folder name, so that relative paths (``scripts/``, another lesson's
notebook) and ``ddp_lib`` on ``PYTHONPATH`` resolve as they do in the course itself.

``python -m workshop.exercises [DEST]`` writes DEST/notebooks/ (default build/exercises).
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

import nbformat

from workshop import sections

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = "solution"
STUB = "exercise-stub"
STUB_INSTRUCTION = "exercise_stub"  # a solution cell's metadata: what its stub tells to do
DEFAULT_INSTRUCTION = "write your code here, then run the cell."
HEADER = re.compile(r"^# Solution to exercise (\d+)(?::\s*(.*))?")


def is_solution(cell: dict) -> bool:
    return SOLUTION in cell.get("metadata", {}).get("tags", [])


def source(cell: dict) -> str:
    text = cell["source"]
    return text if isinstance(text, str) else "".join(text)  # nbformat: str; raw JSON: lines


def stub(solution: dict, exercise: dict) -> dict:
    """The cell a learner fills in: which exercise, what to do where, what it asks, then ``pass``.

    What to do is "write your code here" unless the solution's metadata says otherwise under
    ``STUB_INSTRUCTION``: an exercise that is done by editing another cell (a script) names that
    cell and the cells to run after it, since this one stays empty.
    """
    match = HEADER.match(source(solution))
    number = match[1] if match else "?"
    asked = re.sub(r"\s+", " ", source(exercise).split("<details>")[0]).strip()
    asked = re.sub(r"^\*\*\d+\.\*\*\s*|^\*\*\d+\.\s*", "", asked)
    instruction = solution["metadata"].get(STUB_INSTRUCTION, DEFAULT_INSTRUCTION)
    lines = [f"# {line}" for line in _wrap(f"Exercise {number}: {instruction}", 96)]
    lines += ["#"] + [f"# {line}" for line in _wrap(asked, 96)]
    lines.append("pass")
    cell = copy.deepcopy(solution)
    cell["metadata"]["tags"] = [STUB if tag == SOLUTION else tag
                                for tag in cell["metadata"]["tags"] if tag != "nbval-check-output"]
    cell["metadata"].pop("jupyter", None)  # a stub is meant to be seen
    cell["metadata"].pop(STUB_INSTRUCTION, None)
    cell["source"] = "\n".join(lines)
    cell["outputs"], cell["execution_count"] = [], None
    return cell


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
        elif instructor:
            cell["metadata"].setdefault("jupyter", {})["source_hidden"] = True
    return learners


def build(dest: Path, notebooks: Path = ROOT / "notebooks") -> list[Path]:
    """Write the edition of every lesson into dest/notebooks/; returns the files written."""
    out = dest / "notebooks"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(notebooks.glob("[0-9][0-9]_*.ipynb")):
        target = out / path.name
        nbformat.write(edition(nbformat.read(path, as_version=4)), target)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", nargs="?", type=Path, default=ROOT / "build" / "exercises")
    args = parser.parse_args(argv)
    written = build(args.dest)
    print(f"wrote {len(written)} notebooks to {args.dest / 'notebooks'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
