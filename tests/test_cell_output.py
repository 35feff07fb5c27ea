"""What a notebook cell shows of a launch: progress when quiet, short errors, stale results.

The interrupt and the error display are checked in a real IPython kernel (``jupyter_client``),
because what a learner reads there is IPython's rendering of the exception, not Python's.
"""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

import psutil
import pytest
from conftest import processes_mentioning
from jupyter_client.manager import start_new_kernel

from ddp_lib import StaleResult, launch

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")

COUNTER = """
    import os, time
    for step in range(3):
        print(f"step {step}", flush=True)
        time.sleep(0.3)
"""

SLEEPER = """
    import os, sys, time
    from pathlib import Path
    Path(sys.argv[1], "started.rank" + os.environ["RANK"]).touch()
    time.sleep(300)
"""

CRASHER = """
    import os
    if os.environ["RANK"] == "1":
        raise ValueError("rank 1 gives up")
"""


def test_a_quiet_launch_shows_progress_and_a_stale_result_is_refused(make_script, capsys):
    script = make_script("counter.py", COUNTER)
    result = launch(script, nproc_per_node=2, stream=False, timeout=120)
    out, err = capsys.readouterr()
    # The bar may show a rank's latest line as its postfix; the lines themselves are not echoed.
    assert not re.search(r"^\[rank\d\] step", out + err, re.M), out + err
    bar = err.replace("\r", "\n").strip().splitlines()[-1]
    assert bar.startswith("counter.py: 6 lines from the ranks ["), bar
    assert re.search(r"finished in \d+\.\d s$", bar), bar  # not what it last waited for
    assert (result.run_dir / "output.log").read_text().count("] step ") == 6

    result.require_current()  # the script is as it was launched
    script.write_text(script.read_text() + "print('edited')\n")
    with pytest.raises(StaleResult, match="Re-run the launch cell: this result is from before "
                                          "your edit of .*counter.py"):
        result.require_current()


def test_a_quiet_launch_whose_ranks_print_nothing_says_so(make_script, capsys):
    """What the bar says is what the launch sees: no ranks yet, ranks that may still be
    importing torch, then ranks that have run for a while and printed nothing."""
    # 20 s: the ranks outlive the 10 s a rank may take to import torch by a wide margin
    script = make_script("silent.py", "import time\ntime.sleep(20)\n")
    launch(script, nproc_per_node=2, stream=False, timeout=120)
    err = capsys.readouterr().err.replace("\r", "\n")
    assert re.search(r"the ranks started \d+ s ago: each imports torch first \(timeout 120 s, "
                     r"\d+ s left\)", err), err
    assert re.search(r"the ranks started \d+ s ago, and print nothing \(timeout 120 s, \d+ s "
                     r"left\)", err), err
    assert re.search(r"finished in \d+\.\d s$", err.strip().splitlines()[-1]), err


@pytest.fixture
def kernel(workdir: Path):
    """A Jupyter kernel (as the notebooks run in) whose working folder is the test's."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    manager, client = start_new_kernel(cwd=str(workdir), env=env)
    client.execute_interactive("import ddp_lib", timeout=60)
    yield manager, client
    client.stop_channels()
    manager.shutdown_kernel(now=True)


def _run_cell(client, code: str, timeout: float = 120) -> tuple[str, dict | None]:
    """Run ``code``; its printed text, and its error's content (``None`` if it raised none)."""
    printed, error = [], None

    def collect(message):
        nonlocal error
        if message["msg_type"] == "stream":
            printed.append(message["content"]["text"])
        elif message["msg_type"] == "error":
            error = message["content"]

    client.execute_interactive(code, timeout=timeout, output_hook=collect)
    return "".join(printed), error


def _shown(error: dict) -> list[str]:
    """The error's traceback as the cell shows it, one line per item, colours removed."""
    return ANSI.sub("", "\n".join(error["traceback"])).splitlines()


# nanosleep and clock_nanosleep, by Linux's numbers for each processor
SLEEP_CALLS = {"x86_64": {"35", "230"}, "aarch64": {"101", "115"}}.get(platform.machine())


def _in_sleep_call(process: psutil.Process) -> bool:
    """Whether a worker (not its torchrun agent) is blocked in a sleep system call now."""
    try:
        if "ddp_lib.launching.torchrun_main" in " ".join(process.cmdline()):
            return False
        if SLEEP_CALLS is None:  # another processor: sleeping is as close as we can tell
            return process.status() == psutil.STATUS_SLEEPING
        with open(f"/proc/{process.pid}/syscall", encoding="ascii") as f:
            return f.read().split()[0] in SLEEP_CALLS
    except (OSError, IndexError, psutil.Error):
        return False


def _wait_for(condition, what: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


def test_a_failed_or_interrupted_launch_shows_its_message_without_library_frames(
        make_script, workdir, kernel):
    manager, client = kernel
    make_script("crasher.py", CRASHER)
    _, error = _run_cell(client, "ddp_lib.launch('crasher.py', nproc_per_node=2)")
    shown = _shown(error)
    assert error["ename"] == "RankFailed"
    assert not [line for line in shown if "ddp_lib/" in line], "no frame of ddp_lib's own"
    assert "----> 1 ddp_lib.launch('crasher.py', nproc_per_node=2)" in shown
    assert any(line.startswith("RankFailed: Rank 1 exited with code 1") for line in shown)

    make_script("sleeper.py", SLEEPER)
    client.execute(f"ddp_lib.launch('sleeper.py', args=[{str(workdir)!r}], nproc_per_node=2)")
    # A marker says a rank got there, not that it is past the line that wrote it: wait until
    # both ranks are blocked in time.sleep's system call, so that the stacks name that line.
    _wait_for(lambda: len(list(workdir.glob("started.rank*"))) == 2 and len(
        [p for p in processes_mentioning("sleeper.py") if _in_sleep_call(p)]) == 2,
              "both ranks to sleep")
    manager.interrupt_kernel()  # the stop button
    reply = client.get_shell_msg(timeout=60)
    assert reply["content"]["status"] == "error"
    shown = _shown(reply["content"])
    assert not [line for line in shown if "ddp_lib/" in line], shown
    message = shown.index("LaunchInterrupted: Launch of sleeper.py interrupted: torchrun and "
                          "all its workers were stopped.")
    assert shown[message + 1:message + 4] == [
        "Where each rank was:", "    rank 0: sleeper.py:5  time.sleep(300)",
        "    rank 1: sleeper.py:5  time.sleep(300)"]
    assert message == 0, "the message comes first, then where the cell was"
    assert processes_mentioning("sleeper.py") == []


# The readers of the agents' output hold back their end: the launch is still relaying when every
# process has exited, which is when an interrupt can arrive after the run has finished.
SLOW_END = """
import time
from ddp_lib.launching import supervise
_read_lines = supervise.read_lines

class _HeldEnd:
    def __init__(self, out):
        self.out = out
    def put(self, item):
        if item is None:
            time.sleep(5)
        self.out.put(item)

supervise.read_lines = lambda pipe, stream, node, launcher, out: _read_lines(
    pipe, stream, node, launcher, _HeldEnd(out))
"""


def test_an_interrupt_after_the_run_finished_keeps_its_result(make_script, workdir, kernel):
    manager, client = kernel
    script = make_script("counter.py", COUNTER)
    _run_cell(client, SLOW_END)
    client.execute(f"result = ddp_lib.launch({str(script)!r}, nproc_per_node=2)")

    kernel_process = psutil.Process(manager.provisioner.process.pid)

    def finished() -> bool:
        """Every rank printed all its lines and the agent has exited (a zombie until reaped;
        while it exits, its command line is already gone)."""
        logs = list(workdir.glob("runs/*/output.log"))
        return (bool(logs) and logs[0].read_text().count("] step ") == 6
                and all(child.status() == psutil.STATUS_ZOMBIE
                        for child in kernel_process.children()))

    _wait_for(finished, "the launch's processes to end")
    manager.interrupt_kernel()
    reply = client.get_shell_msg(timeout=60)
    assert reply["content"]["status"] == "ok", reply["content"]
    printed, error = _run_cell(client, "print(result.ok, result.output(1))")
    assert error is None
    assert printed == "True step 0\nstep 1\nstep 2\n"
