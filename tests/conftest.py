"""Shared fixtures: real scripts in a temporary folder, and a check that no process is left.

``make test`` runs the test files in two processes (``-n 2 --dist loadfile``).
"""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import psutil
import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Beside the other lane (make test's -n 2), a test's own torch work gets one thread: two
    # processes each spinning two threads on two cores slow each other down several times over.
    # Launches and notebook kernels are other processes, with their own settings.
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
