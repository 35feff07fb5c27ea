"""Shared fixtures: real scripts in a temporary folder, and a check that no process is left.

Also the split that ``make test`` runs in parallel (``-n 2``, with the scheduler below).
"""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import psutil
import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Beside a notebook (make test's two lanes), a test's own torch work gets one thread: two
    # processes each spinning two threads on two cores slow each other down several times over.
    # The notebooks' kernels and launches are other processes, with their own settings.
    import torch

    torch.set_num_threads(1)


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``text`` (e.g. a test's temporary folder).

    Workers of a stopped torchrun are re-parented away from this process, so looking at our
    children alone would miss exactly the processes that leaked.
    """
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(text in part for part in p.info["cmdline"] or ()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def command_line(process: psutil.Process) -> str:
    """The command line ``processes_mentioning`` saw: asking again fails once the process ends."""
    return " ".join(process.info["cmdline"] or ())


def wait_until_gone(text: str, within: float) -> list[psutil.Process]:
    """Wait up to ``within`` seconds for processes mentioning ``text`` to end; return the rest."""
    deadline = time.monotonic() + within
    left = processes_mentioning(text)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_mentioning(text)
    return left


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A temporary working folder; after the test, no process started from it may be alive."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    left = wait_until_gone(str(tmp_path), within=2)
    described = [command_line(p) for p in left]
    for p in left:
        try:
            p.kill()
        except psutil.Error:  # it ended meanwhile
            pass
    assert not described, f"processes left behind: {described}"


@pytest.fixture
def make_script(workdir: Path):
    """Write a Python script into the test's folder and return its path."""

    def make(name: str, source: str) -> Path:
        path = workdir / name
        path.write_text(textwrap.dedent(source))
        return path

    return make


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected what they deselect
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Execute each notebook once: a notebook that JupyterLab runs in this session (the browser
    test's representative set, where Chromium is there) is not run through nbval as well.

    The browser test fails on any error output, as nbval does, and checks more besides (per-rank
    output, figures, widgets). Without Chromium its module collects nothing, and nbval runs the
    notebook as usual.
    """
    in_browser = {item.callspec.params["notebook"].name for item in items
                  if getattr(item, "originalname", None) == "test_notebook_runs_in_jupyterlab"}
    twice = [item for item in items
             if item.path.suffix == ".ipynb" and item.path.name in in_browser]
    if twice:
        config.hook.pytest_deselected(items=twice)
        items[:] = [item for item in items if item not in twice]


# The lessons that make test runs in the tests' lane, after the tests: the two lanes then take
# about as long as each other (pytest's item times in one make test at ce9f8a4 on a 2-core AMD
# machine: the tests 292 s and these lessons 249 s; lessons 00 and 05-08, the other lane, 554 s).
# Lesson 10 (about 20 s) joins this lane and lesson 11 (about 45 s) the other, with the mpiexec
# tests (about 25 s) here: the lanes stay within a few seconds of each other by those figures.
# Any lesson may run beside any other: a lesson that builds on an earlier one's script writes it
# again from that notebook's source (scripts.from_notebook), both write the same text, whole and
# by rename, and each lesson's checkpoints, traces and launch folders have names of its own.
TESTS_LANE_NOTEBOOKS = ("01_single_device", "02_data_parallel", "03_ring_allreduce",
                        "04_init_methods", "09_hangs", "10_hpc_launchers")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: make test runs with -n 2
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Two lanes, each running its items one after another: lessons 00 and 05-08 in one, the
    tests and then the other lessons (``TESTS_LANE_NOTEBOOKS``) in the other.

    Each lane keeps about one core busy, also while the other waits on a timeout, a rendezvous or
    a browser. (xdist's ``loadscope``, with the lane as the scope.)
    """
    from xdist.scheduler import LoadScopeScheduling

    class TwoLanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith("notebooks/") and not nodeid.startswith(
                    tuple(f"notebooks/{name}" for name in TESTS_LANE_NOTEBOOKS)):
                return "notebooks"
            return "tests"

    return TwoLanes(config, log)
