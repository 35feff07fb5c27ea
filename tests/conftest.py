"""Shared fixtures: real scripts in a temporary folder, and a check that no process is left.

``make test`` runs the suite on two pytest-xdist workers (``--dist loadgroup``); the hook below
keeps each notebook's cells together and starts the longest work first.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import psutil
import pytest


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


def wait_until_gone(text: str, within: float) -> list[psutil.Process]:
    """Wait up to ``within`` seconds for processes mentioning ``text`` to end; return the rest."""
    deadline = time.monotonic() + within
    left = processes_mentioning(text)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_mentioning(text)
    return left


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group each notebook's cells on one worker, and order the work longest first.

    nbval runs a notebook's cells one after the other in one kernel, so they must stay on one
    worker (an ``xdist_group`` per notebook). Workers take work in this order, so tests marked
    ``slow`` (a minute or more each) go first, then the notebooks, then the many short tests,
    which fill the end evenly: both workers finish at about the same time. Without xdist the
    order changes nothing else.
    """
    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("slow"):
            return 0
        return 1 if item.path.suffix == ".ipynb" else 2

    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.xdist_group(item.path.name))
    items.sort(key=rank)  # stable: the collected order within each rank


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A temporary working folder; after the test, no process started from it may be alive."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    left = wait_until_gone(str(tmp_path), within=2)
    described = []
    for p in left:
        try:
            described.append(" ".join(p.cmdline()))
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
