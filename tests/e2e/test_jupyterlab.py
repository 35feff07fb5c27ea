"""The course as attendees use it: every notebook run through JupyterLab's UI in Chromium.

A real JupyterLab server (this environment's, on 127.0.0.1, a free port, a token, throw-away
Jupyter folders, no news or update checks) serves a copy of the notebooks; Playwright drives
Debian's Chromium (never a downloaded browser) headless. For each notebook the test clicks
Run > Run All Cells, waits for the kernel, and checks what a person would look at: no cell shows
an error, every widget renders, launch cells show per-rank output, figures appear. It also moves
lesson 03's ring stepper with the keyboard, and stops a running launch with the toolbar's stop
button. Each lesson's run, once its checks passed, is saved for the site (test_site.py). The
learners' editions are test_editions.py's. Screenshots go to build/screenshots/.

``make test`` drives a representative set: lesson 03 (widgets: the ring stepper; figures; a
launch with live per-rank output) and the stop button (a launch with live output, interrupted).
The other notebooks carry the ``sweep`` marker and run in the browser with ``make
test-browser``, which CI runs after ``make test``; a lesson given to pytest both here and under
nbval runs once, here (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from conftest import processes_mentioning, wait_until_gone

from ddp_lib.launching.launcher import free_ports
from workshop import book

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("DDP_WORKSHOP_CHROMIUM", "/usr/bin/chromium"))
SCREENSHOTS = ROOT / "build" / "screenshots"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NOTEBOOK_TIMEOUT_S = 600
REPRESENTATIVE = ("03_ring_allreduce.ipynb",)

playwright_api = pytest.importorskip("playwright.sync_api")
if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} is not installed (make test installs Debian's chromium package "
                "where it can: as root, with apt-get)", allow_module_level=True)


@contextlib.contextmanager
def jupyterlab(home: Path, root: Path):
    """A JupyterLab server on the notebooks in root, its settings and state under home; stopped,
    with all it started, at the end."""
    # Render every cell (JupyterLab otherwise renders only the cells in view), so that the
    # checks below see what a person scrolling through the notebook would see.
    settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    # No news and no update checks: nothing leaves 127.0.0.1, and no pop-up covers the page.
    apputils = home / "settings" / "@jupyterlab" / "apputils-extension"
    apputils.mkdir(parents=True)
    (apputils / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}')
    port, token = free_ports()[0], secrets.token_hex(16)
    env = {**os.environ,
           "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "run"),
           "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
               "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
               "--LabApp.news_url=None", "--LabApp.expose_app_in_browser=True",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = open(home / "server.log", "w")
    server = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, (home / "server.log").read_text()
                time.sleep(0.3)
        yield {"url": f"http://127.0.0.1:{port}", "token": token, "root": root}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
        # Kernels (their connection files are under home) and anything started from the copy.
        for p in wait_until_gone(str(home), within=10):
            p.kill()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The course: a server on a copy of the notebooks."""
    home = tmp_path_factory.mktemp("lab")
    root = home / "notebooks"
    root.mkdir()
    for notebook in NOTEBOOKS:
        shutil.copy(notebook, root)
    with jupyterlab(home, root) as served:
        yield served


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"])
        try:
            yield chromium
        finally:
            chromium.close()


def open_notebook(browser, lab, name: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    workspace = Path(name).stem  # one fresh workspace per notebook: no tabs from earlier ones
    page.goto(f"{lab['url']}/lab/workspaces/{workspace}/tree/{name}?reset&token={lab['token']}")
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
    wait_for_kernel_idle(page, timeout_s=120)
    return page


def close(page) -> None:
    """Shut the notebook's kernel down, as File > Close and Shut Down would, then the page."""
    try:
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
    finally:
        page.close()


def kernel_status(page) -> str:
    return page.evaluate("""() => {
        const panel = window.jupyterapp.shell.currentWidget;
        return panel && panel.sessionContext ? panel.sessionContext.kernelDisplayStatus : 'none';
    }""")


def wait_for_kernel_idle(page, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while kernel_status(page) != "idle":
        assert time.monotonic() < deadline, f"kernel still '{kernel_status(page)}'"
        time.sleep(0.5)


def run_all_cells(page) -> None:
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


def wait_until_all_cells_ran(page, timeout_s: float) -> None:
    """Until every code cell has run and the kernel is idle. A Run All that an error stopped
    (an error in a cell not tagged ``raises-exception``, nothing queued, the kernel idle) fails
    at once with that error, not after ``timeout_s`` of waiting for cells that will never run."""
    deadline = time.monotonic() + timeout_s
    time.sleep(1)
    while True:
        unrun, queued = page.evaluate("""() => {
            const cells = window.jupyterapp.shell.currentWidget.content.widgets
                .filter(c => c.model.type === 'code');
            return [cells.filter(c => c.model.executionCount === null).length,
                    cells.filter(c => c.promptNode.textContent.includes('*')).length];
        }""")
        idle = kernel_status(page) == "idle"
        if unrun == 0 and queued == 0 and idle:
            return
        if queued == 0 and idle:
            errors = error_outputs(page)
            assert not errors, f"Run All stopped with {unrun} cell(s) never run: {errors}"
        assert time.monotonic() < deadline, (
            f"{unrun + queued} cell(s) still waiting to run after {timeout_s:g} s; "
            f"running:\n{running_cell(page)}")
        time.sleep(1)


def running_cell(page) -> str:
    """The cell the kernel is running (its prompt shows ``*``): its first lines and the last
    lines of its output so far, to say where a lesson stalled."""
    return page.evaluate("""() => {
        for (const cell of window.jupyterapp.shell.currentWidget.content.widgets) {
            if (cell.model.type !== 'code' || !cell.promptNode.textContent.includes('*'))
                continue;
            const source = cell.model.sharedModel.getSource().split('\\n').slice(0, 3);
            const area = cell.node.querySelector('.jp-OutputArea');
            const shown = (area ? area.innerText : '').split('\\n').slice(-15);
            return [...source, '--- its output, last lines:', ...shown].join('\\n');
        }
        return '(none)';
    }""")


def launch_cells(page) -> list[tuple[str, str]]:
    """(source, shown output) of each cell that launches with live output, as rendered."""
    return page.evaluate("""() => {
        const found = [];
        for (const cell of window.jupyterapp.shell.currentWidget.content.widgets) {
            const source = cell.model.sharedModel.getSource();
            if (cell.model.type === 'code' && source.includes('ddp_lib.launch(') &&
                    !source.includes('stream=False')) {
                const area = cell.node.querySelector('.jp-OutputArea');
                found.push([source, area ? area.innerText : '']);
            }
        }
        return found;
    }""")


def error_outputs(page, expected: bool = False) -> list[str]:
    """The errors of the cells not tagged ``raises-exception``, or (``expected``) of those that
    are: in a learners' edition, an exercise's check naming what is not done yet."""
    return page.evaluate("""(expected) => {
        const found = [];
        for (const cell of window.jupyterapp.shell.currentWidget.content.widgets) {
            if (cell.model.type !== 'code') continue;
            const tags = cell.model.getMetadata('tags') || [];
            if (tags.includes('raises-exception') !== expected) continue;
            for (let i = 0; i < cell.model.outputs.length; i++) {
                const out = cell.model.outputs.get(i).toJSON();
                if (out.output_type === 'error') found.push(out.ename + ': ' + out.evalue);
            }
        }
        return found;
    }""", expected)


@pytest.mark.parametrize("notebook", [
    pytest.param(path, marks=() if path.name in REPRESENTATIVE else pytest.mark.sweep)
    for path in NOTEBOOKS], ids=lambda p: p.name)
def test_notebook_runs_in_jupyterlab(browser, lab, notebook):
    page = open_notebook(browser, lab, notebook.name)
    try:
        run_all_cells(page)
        wait_until_all_cells_ran(page, NOTEBOOK_TIMEOUT_S)
        page.wait_for_timeout(1000)  # let the last outputs render
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{notebook.stem}.png"), full_page=True)

        assert error_outputs(page) == []
        text = page.locator(".jp-Notebook").inner_text()
        assert "Error displaying widget" not in text
        for source, shown in launch_cells(page):
            if "torchrun" not in shown:
                continue  # the cell did not launch on this machine (lesson 09's needs 2 GPUs)
            if "did not finish within timeout" in shown:  # a hang, on purpose: its report
                assert "Where each rank was" in shown, f"no hang report under:\n{source}"
            else:
                assert "[rank0]" in shown, f"no per-rank output under the launch cell:\n{source}"
        if "fig = " in notebook.read_text():
            assert page.locator(".jp-RenderedImage img").count() > 0, "figures appear"
        widgets = page.locator(".jupyter-widgets, .widget-container")
        if '"application/vnd.jupyter.widget-view+json"' in notebook.read_text() or \
                "ring_widget(" in notebook.read_text() or "tqdm" in notebook.read_text():
            assert widgets.count() > 0, "ipywidgets render"

        if notebook.name.startswith("03_"):
            check_ring_stepper(page)
        save_executed(page, lab, notebook.name)
    finally:
        close(page)


def save_executed(page, lab, name: str) -> None:
    """This run of a lesson, every output in it, into build/notebooks/, where ``make run`` writes
    its own: the site (``make book``, tests/e2e/test_site.py) is built from them, so that CI does
    not execute the course twice. Only a run that passed the checks above is saved, whole or not
    at all."""
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty",
                           timeout=60_000)
    book.EXECUTED.mkdir(parents=True, exist_ok=True)
    partial = book.EXECUTED / f".{name}.partial"
    shutil.copy(Path(lab["root"]) / name, partial)
    partial.replace(book.EXECUTED / name)


def check_ring_stepper(page) -> None:
    """Move the stepper's step slider with the keyboard: the figure must change with it."""
    stepper = page.locator(".widget-vbox").filter(has=page.locator(".widget-output")).last
    stepper.scroll_into_view_if_needed()
    image = stepper.locator(".widget-output img").first
    image.wait_for(timeout=30_000)
    before = image.get_attribute("src")
    handle = stepper.locator(".widget-slider .noUi-handle").last  # the "step" slider
    handle.focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function(
        "([img, before]) => img.isConnected ? img.src !== before : true",
        arg=[image.element_handle(), before], timeout=30_000)
    after = stepper.locator(".widget-output img").first.get_attribute("src")
    assert after and after != before
    assert "step 1/" in stepper.inner_text() or after != before


SLEEPER = '''
import time
print("worker started", flush=True)
time.sleep(300)
'''


def test_stop_button_stops_a_running_launch(browser, lab):
    name = "interrupt_check.ipynb"
    script = f"sleeper_{os.getpid()}.py"  # a name no other test's processes carry
    cells = [
        f"import ddp_lib\nddp_lib.write_script({script!r}, {SLEEPER!r})",
        f"ddp_lib.launch('scripts/{script}', nproc_per_node=2, backend='gloo', timeout=300)",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, lab["root"] / name)
    page = open_notebook(browser, lab, name)
    try:
        run_all_cells(page)
        deadline = time.monotonic() + 120
        while "[rank1] worker started" not in page.locator(".jp-Notebook").inner_text():
            assert time.monotonic() < deadline, "the launch never started"
            time.sleep(0.5)
        assert processes_mentioning(script)
        page.locator("jp-button[data-command='notebook:interrupt-kernel'], "
                     "button[data-command='notebook:interrupt-kernel']").first.click()
        wait_for_kernel_idle(page, timeout_s=60)
        page.wait_for_timeout(500)
        text = page.locator(".jp-Notebook").inner_text()
        assert "interrupted: torchrun and all its workers were stopped" in text
        first = page.evaluate("""() => {
            const cells = window.jupyterapp.shell.currentWidget.content.widgets;
            const outputs = cells[cells.length - 1].model.outputs;
            for (let i = 0; i < outputs.length; i++) {
                const out = outputs.get(i).toJSON();
                if (out.output_type === 'error') return out.traceback[0];
            }
            return '';
        }""")
        first = re.sub(r"\x1b\[[0-9;]*m", "", first)
        assert first.startswith("LaunchInterrupted: Launch of"), f"the stop message first: {first}"
        assert "LaunchInterrupted" in text  # a KeyboardInterrupt
        assert "supervise.py" not in text, "the message comes without ddp_lib's frames"
        assert wait_until_gone(script, within=10) == []
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "interrupted_launch.png"), full_page=True)
    finally:
        close(page)
