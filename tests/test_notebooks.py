"""Every notebook is a lesson with the course's shape, and is committed without outputs.

nbval runs the notebooks themselves (see the Makefile's test target); these checks read them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
KEEP_OUTPUT = "nbval-check-output"


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def text(cell: dict) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


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
def test_has_the_shape_of_a_lesson(path):
    all_cells = cells(path)
    first = text(all_cells[0])
    assert first.startswith("# "), "the first cell is the lesson's title"
    markdown = "\n".join(text(c) for c in all_cells if c["cell_type"] == "markdown")
    for section in ("What you will learn", "Prerequisites", "Key points", "Exercises"):
        assert section in markdown, f"{path.name} has no '{section}'"
    assert "<details><summary>Solution</summary>" in markdown, "solutions stay folded"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_solution_cells_are_collapsed(path):
    for cell in cells(path):
        if "solution" in cell.get("metadata", {}).get("tags", []):
            assert cell["metadata"].get("jupyter", {}).get("source_hidden") is True
