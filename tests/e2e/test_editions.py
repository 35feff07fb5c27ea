"""The learners' editions as a learner meets them, in JupyterLab in Chromium (the server, the
browser and the helpers are test_jupyterlab.py's).

The `ml` track's edition (``make lab-exercises TRACK=ml``): Run All on each lesson runs
what the day teaches with no error but an unsolved exercise's own, and nothing of the appendix;
the time each lesson took goes to build/ml-run-all.json. Then lesson 05's first exercise
there, as its stub says, the likely mistake first: the check run without the launch must say
what to do, the launch must show progress while it runs, the check must then find what the
exercise expects. Screenshots go to build/screenshots/.

Every test here carries the ``sweep`` marker: ``make test-browser`` runs them, in the lane beside
the course's own lessons (the Makefile says why).
"""

from __future__ import annotations

import itertools
import json
import time

import pytest
from test_jupyterlab import (
    NOTEBOOK_TIMEOUT_S,
    NOTEBOOKS,
    ROOT,
    SCREENSHOTS,
    browser,  # noqa: F401 (a fixture)
    close,
    error_outputs,
    jupyterlab,
    kernel_status,
    open_notebook,
    run_all_cells,
    wait_until_all_cells_ran,
)

from ddp_lib import scripts
from workshop import exercises, schedule

ML = next(track for track in schedule.TRACKS if track.name == "ml")
# What Run All took in each lesson of the ml edition, written as each finishes; the
# figures in docs/benchmarks.md come from this file.
ML_SECONDS = ROOT / "build" / "ml-run-all.json"


@pytest.fixture(scope="module")
def ml_lab(tmp_path_factory):
    """The ml track's edition, built and served as make lab-exercises TRACK=ml does."""
    home = tmp_path_factory.mktemp("ml")
    exercises.build(home, track=ML)
    ML_SECONDS.unlink(missing_ok=True)  # this session's times only
    with jupyterlab(home, home / "notebooks") as served:
        yield served


@pytest.mark.sweep
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_ml_edition_runs_in_jupyterlab(browser, ml_lab, notebook):  # noqa: F811
    """Run All on the ml edition: what the day teaches runs with no error, the appendix
    not at all. The time from the click to the last cell is recorded, not asserted: a test that
    fails on a slow machine is one people learn to skip (the budget, 90 s a lesson and 6 minutes
    in all on 2 cores, is checked against the recorded times in docs/benchmarks.md)."""
    page = open_notebook(browser, ml_lab, notebook.name)
    try:
        started = time.monotonic()
        run_all_cells(page)
        wait_until_all_cells_ran(page, NOTEBOOK_TIMEOUT_S)
        seconds = time.monotonic() - started
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"ml-{notebook.stem}.png"), full_page=True)
        assert error_outputs(page) == []
        for said in error_outputs(page, expected=True):  # a check of an exercise not done yet
            assert said.startswith("ExerciseNotDone: "), said
        text = page.locator(".jp-Notebook").inner_text()
        assert "Error displaying widget" not in text
        cells = page.evaluate("""() => window.jupyterapp.shell.currentWidget.content.widgets
            .map(c => [c.model.type, c.model.sharedModel.getSource()])""")
        appendix = next((i for i, (kind, source) in enumerate(cells)
                         if kind == "markdown" and source.startswith("## Appendix")), len(cells))
        after = [kind for kind, _ in cells[appendix:]]
        assert "code" not in after, "Run All runs nothing of the appendix"
        if appendix < len(cells):
            assert "raw" in after, "the appendix holds what the day does not run, as raw cells"
        times = json.loads(ML_SECONDS.read_text()) if ML_SECONDS.exists() else {}
        times[notebook.name] = round(seconds, 1)
        ML_SECONDS.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")
        print(f"{notebook.name}: Run All took {seconds:.1f} s")
    finally:
        close(page)


SILENCE_S = 5.0  # the longest a running launch cell may show nothing new


def cell_index(page, text: str) -> int:
    """The index of the one code cell, other than an exercise's stub, that contains ``text``."""
    found = page.evaluate("""(text) => window.jupyterapp.shell.currentWidget.content.widgets
        .map((c, i) => [c, i])
        .filter(([c]) => c.model.type === 'code' &&
                         !(c.model.getMetadata('tags') || []).includes('exercise-stub') &&
                         c.model.sharedModel.getSource().includes(text))
        .map(([, i]) => i)""", text)
    assert len(found) == 1, f"{len(found)} cells contain {text!r}"
    return found[0]


def cell_source(page, index: int) -> str:
    return page.evaluate(
        "(i) => window.jupyterapp.shell.currentWidget.content.widgets[i].model.sharedModel"
        ".getSource()", index)


def cell(page, index: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def edit_at_line(page, index: int, line: int) -> None:
    """Click into cell ``index``'s editor and put the cursor at the start of ``line``."""
    cell(page, index).locator(".jp-InputPrompt").first.click()
    page.keyboard.press("Enter")  # edit mode
    page.evaluate("""([i, line]) => {
        const editor = window.jupyterapp.shell.currentWidget.content.widgets[i].editor;
        editor.setCursorPosition({line, column: 0});
        editor.revealPosition({line, column: 0});
        editor.focus();
    }""", [index, line])


def start_cell(page, index: int) -> int | None:
    """Select cell ``index`` and run it alone (Ctrl+Enter), as a person would; returns the
    execution count it had, for ``wait_for_cell``."""
    before = page.evaluate(
        "(i) => window.jupyterapp.shell.currentWidget.content.widgets[i].model.executionCount",
        index)
    cell(page, index).locator(".jp-InputPrompt").first.click()
    page.keyboard.press("Control+Enter")
    return before


def wait_for_cell(page, index: int, before: int | None, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        count, prompt = page.evaluate("""(i) => {
            const c = window.jupyterapp.shell.currentWidget.content.widgets[i];
            return [c.model.executionCount, c.promptNode.textContent];
        }""", index)
        if count not in (None, before) and "*" not in prompt and kernel_status(page) == "idle":
            return
        assert time.monotonic() < deadline, f"cell {index} still running"
        time.sleep(0.3)


def run_cell(page, index: int) -> None:
    wait_for_cell(page, index, start_cell(page, index))


def cell_output(page, index: int) -> str:
    page.wait_for_timeout(300)  # let the last output render
    return cell(page, index).locator(".jp-OutputArea").inner_text()


def screenshot(page, index: int, name: str) -> None:
    cell(page, index).scroll_into_view_if_needed()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name))


def start_watching(page, index: int) -> None:
    """Sample cell ``index``'s output text every 0.5 s in the page, by the browser's clock."""
    page.evaluate("""(i) => {
        const c = window.jupyterapp.shell.currentWidget.content.widgets[i];
        const watch = {ticks: [], changes: [], last: null, start: performance.now()};
        const sample = () => {
            const now = (performance.now() - watch.start) / 1000;
            const running = c.promptNode.textContent.includes('*');
            const text = c.outputArea.node.innerText.trim();
            watch.ticks.push([now, running]);
            if (text !== watch.last) {
                watch.changes.push([now, text.slice(0, 200)]);
                watch.last = text;
            }
        };
        sample();  // before the cell starts: its previous output is no sign of progress
        watch.timer = setInterval(sample, 500);
        window.watchedOutput = watch;
    }""", index)


def stop_watching(page) -> tuple[list[tuple[float, bool]], list[tuple[float, str]]]:
    """(time, running) of each sample and (time, text) of each change since start_watching."""
    return tuple(page.evaluate("""() => {
        const watch = window.watchedOutput;
        clearInterval(watch.timer);
        return [watch.ticks, watch.changes];
    }"""))


def silences(ticks, changes) -> list[tuple[float, float]]:
    """(from, to) of each stretch longer than SILENCE_S in which the running cell showed nothing
    new: from the cell's start to its first output, and between two changes of its output."""
    running = [t for t, is_running in ticks if is_running]
    assert running, "the cell was never seen running"
    start, end = running[0], running[-1]
    shown = [t for t, text in changes if start <= t <= end and text]
    marks = [start, *shown, end]
    return [(a, b) for a, b in itertools.pairwise(marks) if b - a > SILENCE_S]


@pytest.mark.sweep
@pytest.mark.timeout(900)
def test_learners_edition_conversion_done_wrong_then_right(browser, ml_lab):  # noqa: F811
    """Lesson 05's exercise 1 in a learners' edition (the ml track's, where the conversion is
    core), as a learner does it. Run All: the stub is lesson 01's script with the seven steps
    marked as TODO comments, and the check under it says where to start, without stopping Run
    All. Then a conversion without ``set_epoch`` pasted into the stub: the check names that, and
    only that. Then the line typed in: the check passes, its launches showing progress as they
    run."""
    page = open_notebook(browser, ml_lab, "05_ddp.ipynb")
    try:
        run_all_cells(page)
        wait_until_all_cells_ran(page, NOTEBOOK_TIMEOUT_S)
        assert error_outputs(page) == []
        check = cell_index(page, "checks.ddp_conversion(")
        stub = check - 1
        shown = cell_source(page, stub)
        assert shown.startswith("%%write_script my_train_ddp.py\n") and "# TODO 7: " in shown
        assert [line for line in shown.split("\n")[1:] if not line.lstrip().startswith("#")] == [
            line for line in scripts.cell_text("01_single_device.ipynb", "train_single.py")
            .rstrip().split("\n") if not line.lstrip().startswith("#")], (
            "the stub: lesson 01's script, its seven steps marked as TODO comments")
        unconverted = cell_output(page, check)
        screenshot(page, check, "05_exercise1_not_ddp_yet.png")
        assert "ExerciseNotDone" in unconverted and "never calls dist.init_process_group" in (
            unconverted), unconverted
        # Every cell ran (wait_until_all_cells_ran), those after the check too: it stopped
        # nothing, and no other check failed (the homework is in the appendix, as raw cells).
        errors = error_outputs(page, expected=True)
        assert len(errors) == 1 and errors[0].startswith("ExerciseNotDone: "), errors

        # Wrong: the course's conversion without set_epoch, pasted over the stub.
        right = "%%write_script my_train_ddp.py\n" + scripts.cell_text(
            "05_ddp.ipynb", "train_ddp.py").rstrip()
        line = next(text for text in right.split("\n") if "sampler.set_epoch(epoch)" in text)
        edit_at_line(page, stub, 0)
        page.keyboard.press("Control+a")
        page.keyboard.insert_text(right.replace(line + "\n", ""))
        assert cell_source(page, stub) == right.replace(line + "\n", "")
        run_cell(page, stub)
        run_cell(page, check)
        wrong = cell_output(page, check)
        screenshot(page, check, "05_exercise1_check_names_the_mistake.png")
        assert "call sampler.set_epoch(epoch)" in wrong and wrong.count("✗") == 1, wrong
        for frame in ("workshop/checks.py", "ddp_lib/"):
            assert frame not in wrong, f"the message comes without the check's frames:\n{wrong}"

        # Right: the line typed back in; the check passes, and shows progress while it runs.
        edit_at_line(page, stub, right.split("\n").index(line))
        page.keyboard.insert_text(line + "\n")
        assert cell_source(page, stub) == right
        run_cell(page, stub)
        cell(page, check).scroll_into_view_if_needed()
        start_watching(page, check)
        before = start_cell(page, check)
        wait_for_cell(page, check, before)
        ticks, changes = stop_watching(page)
        assert silences(ticks, changes) == [], (
            f"the check showed nothing new for over {SILENCE_S:g} s; output changes: {changes}")
        passed = cell_output(page, check)
        screenshot(page, check, "05_exercise1_check_passes.png")
        assert "Error" not in passed and passed.count("✓") == 6, passed
    finally:
        close(page)
