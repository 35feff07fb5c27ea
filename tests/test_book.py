"""The site's pages as a reader should see them (workshop/book.py): what is folded, what is cut,
what is left out. The whole site is built and opened in Chromium in the sweep
(tests/e2e/test_site.py)."""

from __future__ import annotations

import nbformat
import pytest

from workshop import book, sections

MACHINE = {str(book.ROOT): "ddp-workshop", "/home/someone": "~"}


def lesson(*cells: nbformat.NotebookNode) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 99 · A lesson"),
                                           *cells])


def read(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    return book.for_reading(notebook, book.NOTEBOOKS / "99_lesson.ipynb", "on a laptop", MACHINE)


def test_a_solution_is_folded_with_its_output_and_says_what_it_is():
    solution = nbformat.v4.new_code_cell("# Solution to exercise 1\nprint(6)",
                                         metadata={"tags": ["solution"]})
    shown = read(lesson(solution)).cells[2]
    assert "hide-cell" in shown.metadata.tags
    assert shown.metadata.mystnb["code_prompt_show"] == "Show the solution"


def test_instructor_notes_are_folded_under_their_heading():
    notes = nbformat.v4.new_markdown_cell(
        "## Notes\n\n1. Say it twice.", metadata={sections.KEY: {"tier": "instructor"}})
    after = nbformat.v4.new_markdown_cell("More notes.")
    shown = read(lesson(notes, after)).cells
    assert shown[2].source.startswith("## Notes\n\n<details><summary>Notes for instructors")
    assert shown[2].source.endswith("1. Say it twice.\n\n</details>")
    assert shown[3].source.startswith("<details>")


def test_an_error_keeps_its_last_line_and_no_output_keeps_this_machines_folders():
    failing = nbformat.v4.new_code_cell("run()", outputs=[
        nbformat.v4.new_output("error", ename="RankFailed", evalue=f"rank 1 failed in "
                               f"{book.ROOT}/notebooks/scripts/x.py",
                               traceback=["\x1b[31mTraceback\x1b[0m", "frame 1", "frame 2"]),
        nbformat.v4.new_output("stream", name="stdout", text="saved /home/someone/data/x.pt\n"),
    ])
    error, stream = read(lesson(failing)).cells[2].outputs
    assert error.traceback == ["RankFailed: rank 1 failed in scripts/x.py"]  # the lesson says so
    assert stream.text == "saved ~/data/x.pt\n"


def test_a_widget_says_it_needs_a_kernel_and_a_progress_bar_goes():
    view = {"model_id": "1", "version_major": 2, "version_minor": 0}
    cell = nbformat.v4.new_code_cell("w", outputs=[
        nbformat.v4.new_output("display_data", data={
            book.WIDGET: view, "text/plain": "VBox(children=(IntSlider(value=4),))"}),
        nbformat.v4.new_output("display_data", data={
            book.WIDGET: view, "text/plain": "train.py: 0 lines from the ranks [00:00]"}),
    ])
    widget, = read(lesson(cell)).cells[2].outputs
    assert "needs a live kernel" in widget.data["text/markdown"]


def test_each_lesson_says_how_to_run_it():
    shown = read(lesson()).cells[1].source
    assert "make lab LESSON=99_lesson.ipynb" in shown and "on a laptop" in shown


@pytest.mark.parametrize(("page", "text", "expected"), [
    ("docs", "[the GPU figures](benchmarks.md#gpu)", "[the GPU figures](benchmarks.md#gpu)"),
    ("docs", "[lesson 05](../notebooks/05_ddp.ipynb)", "[lesson 05](../notebooks/05_ddp.ipynb)"),
    ("notebooks", "[how it works](../docs/how-it-works.md)",
     "[how it works](../docs/how-it-works.md)"),
    ("docs", "[the checks](../workshop/checks.py)", "the checks (`workshop/checks.py`)"),
    ("docs", "[`workshop/checks.py`](../workshop/checks.py)", "`workshop/checks.py`"),
    ("docs", "[instructors](instructors.md)", "instructors (`docs/instructors.md`)"),
    ("docs", "[PyTorch](https://pytorch.org)", "[PyTorch](https://pytorch.org)"),
    ("docs", "![a figure](figure.png)", "![a figure](figure.png)"),
])
def test_a_link_outside_the_site_becomes_the_name_of_what_it_pointed_to(page, text, expected):
    assert book.site_links(text, page) == expected


def test_a_run_of_other_code_is_not_current_and_other_prose_is_the_courses(tmp_path):
    course = book.NOTEBOOKS / "02_data_parallel.ipynb"
    ran = nbformat.read(course, as_version=4)
    code = next(cell for cell in ran.cells if cell.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
    prose = next(cell for cell in ran.cells if cell.cell_type == "markdown")
    prose.source = "# An older title"
    nbformat.write(ran, tmp_path / course.name)
    assert book.is_current(tmp_path / course.name, course)
    page = book.with_outputs(course, tmp_path / course.name)
    assert page.cells[0].source.startswith("# 02 ·"), "the prose is the course's own"
    assert next(c for c in page.cells if c.cell_type == "code").outputs[0].text == "ran\n"
    code.source += "\nprint('edited')"
    nbformat.write(ran, tmp_path / course.name)
    assert not book.is_current(tmp_path / course.name, course)
    assert not book.is_current(tmp_path / "missing.ipynb", course)


def test_a_failing_ranks_traceback_keeps_its_scripts_frames_only():
    text = (
        "[rank1] Traceback (most recent call last):\n"
        '[rank1]   File "/tmp/pytest-of-root/lab0/notebooks/scripts/eval_on_rank0.py", line 43, '
        "in <module>\n"
        "[rank1]     dist.barrier()\n"
        "[rank1]     ^^^^^^^^^^^^^^\n"
        '[rank1]   File "/root/.cache/ddp-workshop/venv-py311-1a9e8134ff1e/lib/python3.11/'
        'site-packages/torch/distributed/c10d_logger.py", line 83, in wrapper\n'
        "[rank1]     return func(*args, **kwargs)\n"
        "[rank1]            ^^^^^^^^^^^^^^^^^^^^^\n"
        '[rank1]   File "/root/.cache/ddp-workshop/venv-py311-1a9e8134ff1e/lib/python3.11/'
        'site-packages/torch/distributed/distributed_c10d.py", line 6364, in barrier\n'
        "[rank1]     work = group.barrier(opts=opts)\n"
        "[rank1] RuntimeError: Detected mismatch between collectives on ranks.\n"
        "[rank0] done\n")
    shown = book.short_tracebacks(book.scrubbed(text, MACHINE))
    assert shown == (
        "[rank1] Traceback (most recent call last):\n"
        '[rank1]   File "scripts/eval_on_rank0.py", line 43, in <module>\n'
        "[rank1]     dist.barrier()\n"
        f"[rank1]   {book.LEFT_OUT}\n"
        "[rank1] RuntimeError: Detected mismatch between collectives on ranks.\n"
        "[rank0] done\n")
