"""ddp_lib.launch with real torchrun launches: success, failures, timeouts, interrupts, leaks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import command_line, processes_mentioning, wait_until_gone
from torch.distributed.elastic.multiprocessing.errors import (
    ChildFailedError,
    ErrorHandler,
    ProcessFailure,
)

from ddp_lib import LaunchError, LaunchTimeout, RankFailed, launch, launch_nodes
from ddp_lib.launching import messages, output, records, torchrun
from ddp_lib.launching.result import LaunchResult, Line

ROOT = Path(__file__).resolve().parents[1]

ALL_REDUCE = """
    import os, sys
    import time
    import torch
    import torch.distributed as dist
    from course_helpers import report

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    print(f"rank {rank} of {dist.get_world_size()} got {t.item():g}")
    print(f"warning from rank {rank}", file=sys.stderr)
    print(f"backend={os.environ.get('DDP_BACKEND')} extra={os.environ.get('EXTRA')}")
    report("sum", t.item(), step=rank)
    dist.barrier()
    time.sleep(0.2)  # torch 2.4-2.7 can hang in destroy: pytorch/pytorch#154976
    dist.destroy_process_group()
"""

RANK1_FAILS = """
    import os, sys
    import time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        if sys.argv[1] == "raise":
            raise ValueError("rank one gives up")
        os.kill(os.getpid(), 9)
    dist.all_reduce(torch.ones(1))  # rank 0 blocks here: rank 1 never joins
    time.sleep(0.2)  # torch 2.4-2.7 can hang in destroy: pytorch/pytorch#154976
    dist.destroy_process_group()
"""

SLEEPER = """
    import os, sys, time
    from pathlib import Path
    print("started", flush=True)
    Path(sys.argv[1], "started.rank" + os.environ["RANK"]).touch()
    time.sleep(300)
"""


def test_launch_streams_ranks_and_collects_metrics(make_script, capsys):
    script = make_script("allreduce.py", ALL_REDUCE)
    result = launch(script, nproc_per_node=2, backend="gloo", env={"EXTRA": "yes"}, timeout=120)
    assert result.ok and result.returncode == 0
    assert result.ranks() == [0, 1]
    assert "rank 1 of 2 got 3" in result.output(1)
    assert "warning from rank 0" in result.output(0, stream="stderr")
    assert "warning from rank 0" not in result.output(0, stream="stdout")
    assert "backend=gloo extra=yes" in result.output(1)
    assert result.metric("sum", rank=0) == [(0, 3.0)]
    assert result.metric("sum", rank=1) == [(1, 3.0)]
    assert {line.rank for line in result.lines if "got 3" in line.text} == {0, 1}
    shown = capsys.readouterr()
    assert "[rank1] rank 1 of 2 got 3" in shown.out
    assert "[rank0] warning from rank 0" in shown.err
    # Without restarts the workers meet at the store torchrun serves them: nothing to set.
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in shown.out
    # The command printed is the one a person types, after every variable that changes what a
    # rank does (the backend asked for, the caller's env); the notebook's own settings (logs,
    # rank labels) reach torchrun through its environment.
    typed = f"torchrun --standalone --nproc-per-node=2 {script}"
    assert shown.out.splitlines()[0] == f"$ DDP_BACKEND=gloo EXTRA=yes {typed}"
    assert result.command == typed.split()
    assert (result.run_dir / "torchrun").is_dir()  # torchrun's logs stay with the launch


def test_one_process_is_shown_the_threads_variable_that_torchrun_would_not_set(make_script,
                                                                              capsys,
                                                                              monkeypatch):
    """torchrun sets OMP_NUM_THREADS=1 itself for two processes or more, and for one it does
    not: a launch that sets it for one process prints it in front of the command."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    script = make_script("threads.py", "import torch\nprint('threads', torch.get_num_threads())\n")
    one = launch(script, nproc_per_node=1, timeout=120)
    typed = f"torchrun --standalone --nproc-per-node=1 {script}"
    assert capsys.readouterr().out.splitlines()[0] == f"$ OMP_NUM_THREADS=1 {typed}"
    assert "threads 1" in one.output(0)
    launch(script, nproc_per_node=2, timeout=120)  # torchrun's own setting: nothing to print
    typed = typed.replace("=1 ", "=2 ")
    assert capsys.readouterr().out.splitlines()[0] == f"$ {typed}"
    two = launch(script, nproc_per_node=2, timeout=120, env={"OMP_NUM_THREADS": "2"})
    # Not what torchrun would set: printed.
    assert capsys.readouterr().out.splitlines()[0] == f"$ OMP_NUM_THREADS=2 {typed}"
    assert "threads 2" in two.output(0)


def test_the_printed_command_pasted_in_a_terminal_gives_the_same_run(make_script, workdir,
                                                                     capsys):
    """What a cell prints after ``$`` is the whole run: the same line in a shell, in the same
    folder, with the course's environment on the PATH, makes the ranks print the same lines."""
    script = make_script("allreduce.py", ALL_REDUCE)
    result = launch(script, nproc_per_node=2, backend="gloo", env={"EXTRA": "yes"}, timeout=120)
    printed = capsys.readouterr().out.splitlines()[0]
    assert printed.startswith("$ ")
    terminal = {k: v for k, v in os.environ.items()
                if k not in ("DDP_BACKEND", "EXTRA", "OMP_NUM_THREADS")}
    terminal["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{terminal['PATH']}"
    pasted = subprocess.run(["bash", "-c", printed[2:]], cwd=workdir, env=terminal,
                            capture_output=True, text=True, timeout=120)
    assert pasted.returncode == 0, pasted.stderr
    for rank in (0, 1):
        assert f"rank {rank} of 2 got 3" in pasted.stdout
        assert f"rank {rank} of 2 got 3" in result.output(rank)
    assert pasted.stdout.count("backend=gloo extra=yes") == 2, pasted.stdout
    assert "sum" not in pasted.stdout  # outside a launch report() is quiet: nothing collects
    for rank in (0, 1):
        assert result.metric("sum", rank=rank) == [(rank, 3.0)]


@pytest.fixture
def notebook_bars(monkeypatch) -> list:
    """The progress bars launches draw, as in JupyterLab: tqdm.notebook's widgets."""
    from tqdm.notebook import tqdm

    drawn = []
    original = output._progress_bar

    def widget_bar(script):
        with monkeypatch.context() as patch:
            patch.setattr("tqdm.auto.tqdm", tqdm)
            drawn.append(original(script))
        return drawn[-1]

    monkeypatch.setattr(output, "_progress_bar", widget_bar)
    return drawn


def bar_shown(bar) -> tuple[str, str]:
    """(style, text) of a tqdm.notebook bar: "danger" is red, "success" green."""
    _, progress, text = bar.container.children
    return progress.bar_style, text.value.replace("\u2007", " ")  # tqdm's fixed-width spaces


def test_failing_rank_ends_launch_promptly_and_is_named(make_script, notebook_bars):
    script = make_script("fails.py", RANK1_FAILS)
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        launch(script, args=["raise"], nproc_per_node=2, timeout=120, stream=False)
    elapsed = time.monotonic() - start
    style, text = bar_shown(notebook_bars[-1])
    assert style == "danger" and "rank 1 failed: ValueError: rank one gives up" in text, text
    err = info.value
    assert err.rank == 1 and err.exitcode == 1
    assert "Rank 1 exited with code 1" in str(err)
    assert 'raise ValueError("rank one gives up")' in str(err)  # the line, from its traceback
    # Without @record no error file: the launch reads the rank's traceback, as a person would.
    assert messages.raised_errors(err.result) == {}
    assert "error_file: <N/A>" in err.result.output("torchrun").split("Root Cause")[1]
    assert elapsed < 30, f"rank 0 was blocked in all_reduce, yet the launch took {elapsed:.0f} s"
    assert not err.result.ok


RECORDED = """
    import torch
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import record


    @record
    def main():
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            raise ValueError("rank one gives up")
        dist.all_reduce(torch.ones(1))  # rank 0 waits here, and raises when rank 1 is gone


    main()
"""


def test_a_script_with_record_is_named_from_the_error_file_torchrun_reads(make_script):
    script = make_script("recorded.py", RECORDED)
    with pytest.raises(RankFailed) as info:
        launch(script, nproc_per_node=2, timeout=120, stream=False)
    err = info.value
    assert err.rank == 1 and "ValueError: rank one gives up" in str(err)
    assert messages.raised_errors(err.result)[1].message == "ValueError: rank one gives up"
    root_cause = err.result.output("torchrun").split("Root Cause")[1]
    assert "error_file: <N/A>" not in root_cause and "rank one gives up" in root_cause
    # Every rank that failed or was stopped, by time: rank 1's error first, then rank 0's end.
    listed = str(err).split("What each rank did, in order:\n")[1].splitlines()
    assert "rank 1: ValueError: rank one gives up" in listed[0], listed


def failed(folder: Path, rank: int, exitcode: int, raised: Exception | None = None,
           at: float = 100.0) -> ProcessFailure:
    """torchrun's record of a rank that failed, as its agent makes it: from the error file the
    rank's @record wrote (torch's own ErrorHandler) if it raised, else stamped when the agent
    saw it end (``at``, to the second). Its pid is 10 + rank."""
    error_file = folder / f"error{rank}.json"

    class ToFile(ErrorHandler):
        def _get_error_file_path(self) -> str:
            return str(error_file)

    if raised is not None:
        try:
            raise raised
        except Exception as handled:
            ToFile().record_exception(handled)
        os.utime(error_file, (at, at))
    failure = ProcessFailure(local_rank=rank, pid=10 + rank, exitcode=exitcode,
                             error_file=str(error_file))
    if raised is None:
        failure.timestamp = int(at)
    return failure


def result_of(run_dir: Path, failures_by_rank: dict[int, ProcessFailure],
              lines: list[Line] = ()) -> LaunchResult:
    """A failed launch whose agent reported ``failures_by_rank`` (a ChildFailedError's)."""
    record = records.path(run_dir, "torchrun")
    records.record(record, ChildFailedError("job.py", failures_by_rank))
    return LaunchResult(script=Path("job.py"), command=[], run_dir=run_dir, returncode=1,
                        lines=list(lines), failure_report=records.read(run_dir))


def printed_traceback(rank: int, error: str, at: float) -> list[Line]:
    """What a rank prints of an uncaught exception, read by the launch at ``at``."""
    return [Line(f"rank{rank}", "stderr", text, time=at) for text in [
        "Traceback (most recent call last):", '  File "job.py", line 9, in <module>', error]]


def stopped(rank: int, at: float, sig: str = "SIGTERM") -> Line:
    """torchrun's log line as it stops the worker of ``rank`` (pid 10 + rank, as ``failed``)."""
    return Line("torchrun", "stderr", f"W1129 15:05:18.156000 2109 torch/distributed/elastic/"
                f"multiprocessing/api.py:1028] Sending process {10 + rank} closing signal {sig}",
                time=at)


def test_without_error_files_the_rank_whose_traceback_came_first_is_named(workdir):
    """Two ranks failing in the same second: torchrun's own report names the lower one, here the
    wrong one; when their tracebacks arrived tells."""
    lines = (printed_traceback(0, "RuntimeError: [pair.cc:561] Connection closed by peer "
                                  "[127.0.0.1]:14749.", at=100.3)
             + printed_traceback(1, "RuntimeError: [unbound_buffer.cc:78] Timed out waiting "
                                    "4000ms", at=100.1))
    result = result_of(workdir, {0: failed(workdir, 0, 1), 1: failed(workdir, 1, 1)}, lines)

    assert messages.root_cause(result) == (1, 1)
    message = messages.failure_message(result, 1, 1)
    assert message.startswith("Rank 1 exited with code 1")
    listed = message.split("What each rank did, in order:")[1]
    assert listed.index("rank 1: RuntimeError: [unbound_buffer.cc:78]") < listed.index(
        "rank 0: RuntimeError: [pair.cc:561] Connection closed by peer"), listed

    # torchrun stopped the job before rank 1 exited (torch 2.4 keeps no record of it then): no
    # exit code for it is made up.
    result = result_of(workdir, {0: failed(workdir, 0, 1)}, lines)
    assert messages.root_cause(result) == (1, None)
    assert messages.failure_message(result, 1, None).startswith(
        "Rank 1 raised an exception, and torchrun stopped it before it exited, while running")


def test_an_error_file_and_a_printed_traceback_are_ordered_together(workdir):
    # Rank 0's @record wrote its file at 100.2, but rank 1 had raised at 100.1 (its traceback):
    # rank 1 is named. The last traceback a rank printed is the one that ended it (an earlier
    # attempt's error is not this failure's).
    lines = (printed_traceback(1, "ValueError: the first attempt's", at=50.0)
             + printed_traceback(1, "RuntimeError: Timed out waiting 4000ms", at=100.1))
    peer_gone = RuntimeError("Connection closed by peer")
    result = result_of(workdir, {0: failed(workdir, 0, 1, peer_gone, at=100.2)}, lines)
    assert messages.root_cause(result) == (1, None)
    assert messages.last_error(result, 0) == "RuntimeError: Connection closed by peer"
    assert messages.last_error(result, 1) == "RuntimeError: Timed out waiting 4000ms"
    assert "Timed out waiting 4000ms" in messages.failure_message(result, 1, None)


def test_an_earlier_attempts_traceback_is_not_shown_as_this_failures(workdir):
    # Rank 1 raised in the first attempt; torchrun restarted the workers at 60, and in the last
    # attempt rank 1 was killed without a report: its old traceback is not its error now.
    lines = printed_traceback(1, "ValueError: the first attempt's", at=50.0)
    result = result_of(workdir, {1: failed(workdir, 1, -9, at=100.0)}, lines)
    result.restarted_at = 60.0
    assert messages.root_cause(result) == (1, -9)
    message = messages.failure_message(result, 1, -9)
    assert message.startswith("Rank 1 was killed by SIGKILL") and "first attempt" not in message


def test_the_rank_that_raised_first_is_read_to_the_fraction_of_a_second(workdir):
    # torchrun's timestamps are whole seconds; when the error files were written is finer.
    result = result_of(workdir, {
        0: failed(workdir, 0, 1, ValueError("rank 0's shard is missing"), at=100.6),
        1: failed(workdir, 1, 1, ValueError("rank 1's shard is missing"), at=100.2)})
    assert messages.root_cause(result) == (1, 1)
    assert messages.raised_errors(result)[0].message == "ValueError: rank 0's shard is missing"
    assert "Traceback" in messages.failure_message(result, 1, 1)


def test_a_rank_that_raised_first_but_exited_last_is_said_to_have_raised(workdir):
    # Both ranks raise the same error; rank 1 first, but rank 0 exits first, and torchrun stops
    # rank 1 (seen under load, with lesson 05's shuffle-and-sampler mistake).
    mistake = ValueError("sampler option is mutually exclusive with shuffle")
    result = result_of(workdir, {0: failed(workdir, 0, 1, mistake, at=100.6),
                                 1: failed(workdir, 1, -15, mistake, at=100.2)},
                       [stopped(1, at=100.7)])
    assert messages.root_cause(result) == (1, -15)
    message = messages.failure_message(result, 1, -15)
    assert message.startswith("Rank 1 raised an exception, and torchrun stopped it before it "
                              "exited, while running job.py"), message
    assert "killed" not in message and "ValueError: sampler option" in message, message
    assert "stopped by torchrun (SIGTERM) at " in message, message


def test_a_rank_killed_without_a_report_comes_before_the_errors_it_caused(workdir):
    # torchrun saw rank 1 end in second 100 (it looks every 0.1 s); rank 0 lost its peer at
    # 100.3, and torchrun stopped it.
    peer_gone = RuntimeError("Read error: Connection reset by peer")
    result = result_of(workdir, {1: failed(workdir, 1, -9, at=100.0),
                                 0: failed(workdir, 0, -15, peer_gone, at=100.3)},
                       [stopped(0, at=100.4)])
    assert messages.root_cause(result) == (1, -9)
    message = messages.failure_message(result, 1, -9)
    assert message.startswith("Rank 1 was killed by SIGKILL (out of memory, or killed by hand?)")
    assert "(torchrun's time, to the second)" in message, message


def test_a_rank_torchrun_stopped_is_not_named(workdir):
    # No error files (NCCL ranks wait without raising): the stopped rank 0 was "seen" in the same
    # second as the killed rank 1, and torchrun's own report names it.
    result = result_of(workdir, {0: failed(workdir, 0, -15), 1: failed(workdir, 1, -9)},
                       [stopped(0, at=100.2)])
    assert messages.root_cause(result) == (1, -9)
    # Rank 0 raised only because its peer went; of the two that raised nothing, the SIGKILLed
    # rank 2 failed by itself, and rank 1 was stopped by torchrun.
    peer_gone = RuntimeError("Connection reset by peer")
    result = result_of(workdir, {1: failed(workdir, 1, -15), 2: failed(workdir, 2, -9),
                                 0: failed(workdir, 0, 1, peer_gone, at=100.4)},
                       [stopped(1, at=100.5)])
    assert messages.root_cause(result) == (2, -9)


def test_the_message_says_what_every_rank_did_in_order(workdir):
    result = result_of(workdir, {0: failed(workdir, 0, -9), 2: failed(workdir, 2, -15),
                                 1: failed(workdir, 1, 1, ValueError("bad shard"), at=5.0)},
                       [stopped(2, at=100.2)])
    assert messages.root_cause(result) == (1, 1)
    message = messages.failure_message(result, 1, 1)
    listed = message.split("What each rank did, in order:\n")[1].splitlines()
    assert [line.split("  rank ")[1][:1] for line in listed[:3]] == ["1", "0", "2"], listed
    assert listed[0].endswith("rank 1: ValueError: bad shard; exited with code 1")
    assert listed[1].endswith("rank 0: killed by SIGKILL  (torchrun's time, to the second)")
    assert "rank 2: stopped by torchrun (SIGTERM) at " in listed[2]


TWO_ATTEMPTS = """
    import os, time
    import torch.distributed as dist

    dist.init_process_group("gloo")
    attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), dist.get_rank()
    if attempt == 0 and rank == 0:
        raise RuntimeError("the first attempt's error")  # torchrun stops rank 1, then restarts
    if attempt == 1 and rank == 1:
        raise ValueError("the last attempt's error")  # torchrun stops rank 0, and gives up
    time.sleep(60)
"""


def test_an_earlier_attempts_error_is_not_this_failures(make_script):
    script = make_script("two_attempts.py", TWO_ATTEMPTS)
    with pytest.raises(RankFailed) as info:
        launch(script, nproc_per_node=2, max_restarts=1, timeout=120, stream=False)
    err = info.value
    assert err.rank == 1 and "ValueError: the last attempt's error" in str(err), str(err)
    assert "the first attempt's error" not in str(err), str(err)
    assert err.result.restarted_at is not None
    stale = err.result.output(0, stream="stderr")
    assert "RuntimeError: the first attempt's error" in stale  # still in the output


def test_rank_killed_by_signal_is_reported(make_script):
    script = make_script("killed.py", RANK1_FAILS)
    with pytest.raises(RankFailed) as info:
        launch(script, args=["kill"], nproc_per_node=2, timeout=120, stream=False)
    assert info.value.rank == 1
    assert "killed by SIGKILL" in str(info.value)


CRASHES = """
    import ctypes, os, time

    def read_address_zero():
        return ctypes.string_at(0)  # a crash in native code: SIGSEGV

    if os.environ["RANK"] == "1":
        read_address_zero()
    time.sleep(60)  # rank 0 waits, as a rank blocked in a collective would
"""


def test_a_rank_that_crashes_in_native_code_is_named_with_its_line(make_script):
    script = make_script("crash.py", CRASHES)
    with pytest.raises(RankFailed) as info:
        launch(script, nproc_per_node=2, timeout=120, stream=False)
    message = str(info.value)
    assert info.value.rank == 1 and "killed by SIGSEGV" in message, message
    assert "It crashed at crash.py:5  return ctypes.string_at(0)" in message, message
    assert "Extension modules" not in message, message


def test_a_crash_is_placed_in_the_thread_that_crashed(tmp_path):
    """faulthandler lists every thread; the line given is the crashing thread's, and a crash in a
    thread with no frame in the script says where the script was instead of claiming that line."""
    script = tmp_path / "train.py"
    script.write_text("def main():\n    step()\n    loader()\n")
    main_thread = f'  File "{script}", line 2 in main\n'
    helper = f'  File "{script}", line 3 in main\n'
    report = ("Fatal Python error: Segmentation fault\n\n"
              f"Thread 0x01 (most recent call first):\n{helper}\n"
              f"Current thread 0x02 (most recent call first):\n{main_thread}")
    assert messages.crash_location(report, script) == "It crashed at train.py:2  step()"
    elsewhere = ("Fatal Python error: Segmentation fault\n\n"
                 f"Thread 0x02 (most recent call first):\n{main_thread}\n"
                 "Current thread 0x01 (most recent call first):\n  <no Python frame>\n")
    assert messages.crash_location(elsewhere, script) == (
        "It crashed outside the script's own frames, while the script was at train.py:2  step()")


def test_check_false_returns_the_failed_result(make_script):
    script = make_script("exit3.py", "import sys; print('bye'); sys.exit(3)\n")
    result = launch(script, nproc_per_node=1, timeout=120, stream=False, check=False)
    assert result.returncode != 0 and not result.ok
    assert result.output(0) == "bye"


def test_timeout_stops_everything(make_script, workdir, notebook_bars):
    script = make_script("sleeper.py", SLEEPER)
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        launch(script, args=[workdir], nproc_per_node=2, timeout=12, stream=False)
    assert bar_shown(notebook_bars[-1])[0] == "danger"
    assert "timed out: every process stopped" in bar_shown(notebook_bars[-1])[1]
    assert time.monotonic() - start < 12 + 20
    assert "did not finish within timeout=12 s" in str(info.value)
    assert "started" in str(info.value)  # the last lines of each rank are shown
    assert wait_until_gone(str(workdir), within=5) == []


NODE_REPORT = """
    import os
    import time
    import torch
    import torch.distributed as dist
    from course_helpers import report

    dist.init_process_group("gloo")
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    report("node", int(os.environ["GROUP_RANK"]), cores=sorted(os.sched_getaffinity(0)),
           world=dist.get_world_size(), sum=t.item())
    dist.barrier()
    time.sleep(0.2)  # torch 2.4-2.7 can hang in destroy: pytorch/pytorch#154976
    dist.destroy_process_group()
"""

NODE1_FAILS = """
    import os
    import time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if os.environ["GROUP_RANK"] == "1":
        raise RuntimeError("node one is lost")
    dist.all_reduce(torch.ones(1))  # node 0 blocks here: its peer never joins
    time.sleep(0.2)  # torch 2.4-2.7 can hang in destroy: pytorch/pytorch#154976
    dist.destroy_process_group()
"""


def test_launch_nodes_runs_one_job_over_two_simulated_machines(make_script, capsys):
    script = make_script("nodes.py", NODE_REPORT)
    result = launch_nodes(script, nnodes=2, nproc_per_node=1, timeout=120)
    assert result.ok and result.ranks() == [0, 1]
    records = [m for m in result.metrics if m["name"] == "node"]
    assert sorted(int(m["value"]) for m in records) == [0, 1]  # one worker per node
    assert {m["world"] for m in records} == {2} and {m["sum"] for m in records} == {3.0}
    if len(os.sched_getaffinity(0)) >= 2:  # each "machine" has cores of its own
        first, second = (set(m["cores"]) for m in records)
        assert first and second and not first & second
    shown = capsys.readouterr().out
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in shown
    assert "torchrun --nnodes=2" in shown
    assert (result.run_dir / "torchrun-node1").is_dir()


def test_a_failing_node_stops_the_other_promptly(make_script, workdir):
    script = make_script("node_fails.py", NODE1_FAILS)
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        launch_nodes(script, nnodes=2, nproc_per_node=1, timeout=120, stream=False)
    assert time.monotonic() - start < 40
    assert "RuntimeError: node one is lost" in str(info.value)
    assert info.value.rank == 1, "node 0's rank only lost its peer"
    assert wait_until_gone(str(workdir), within=5) == []


def test_launch_nodes_needs_several_nodes(make_script):
    script = make_script("ok.py", "print('never runs')\n")
    with pytest.raises(ValueError, match="nnodes >= 2"):
        launch_nodes(script, nnodes=1)


RESTARTED = """
    import os, time
    import torch
    import torch.distributed as dist

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    if attempt == 1 and rank == 1:
        time.sleep(3)  # the restarted rank 1 comes late: rank 0 must not find its old address
    dist.init_process_group("gloo")
    # One tensor that lives to the end: torch 2.4 can deadlock in destroy_process_group when
    # Gloo's thread frees a dropped tensor (docs/compatibility.md, lesson 03's fix).
    ones = torch.ones(1000)
    for step in range(10):
        dist.all_reduce(ones)
        if attempt == 0 and rank == 1 and step == 3:
            os.kill(os.getpid(), 9)  # a worker dies; torchrun restarts the group
    print(f"attempt {attempt} done", flush=True)
    dist.barrier()
    time.sleep(0.2)  # torch 2.4-2.7 can hang in destroy: pytorch/pytorch#154976
    dist.destroy_process_group()
"""


def test_max_restarts_recovers_from_a_killed_worker(make_script, capsys):
    script = make_script("restarted.py", RESTARTED)
    result = launch(script, nproc_per_node=2, max_restarts=1, timeout=180)
    assert result.ok
    for rank in (0, 1):
        assert "attempt 1 done" in result.output(rank).splitlines()
    # The workers get a store of their own where torchrun would share its own (torch 2.5 on).
    command = capsys.readouterr().out.splitlines()[0]
    own_store = "$ TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 " if torchrun.shares_store() else "$ "
    typed = f"torchrun --standalone --nproc-per-node=2 --max-restarts=1 {script}"
    assert command == f"{own_store}{typed}"


def test_the_workers_get_a_store_of_their_own_only_with_restarts():
    assert torchrun.restart_env(0) == {}
    expected = torchrun.OWN_STORE_ENV if torchrun.shares_store() else {}
    assert torchrun.restart_env(2) == expected
    # torchrun's agent serves the workers' store from torch 2.5 on (torch 2.4: rank 0's worker).
    release = tuple(int(part) for part in torch.__version__.split(".")[:2])
    assert torchrun.shares_store() == (release >= (2, 5))


def _launch_in_child(workdir: Path, script: Path, args: list | None = None,
                     launcher: str = "torchrun") -> subprocess.Popen:
    """A separate Python process (like a notebook kernel) that launches ``script``.

    Like a Jupyter kernel, it turns SIGINT into KeyboardInterrupt even if the test run was
    started with SIGINT ignored (a shell's background job is), which Python would inherit.
    """
    words = [str(arg) for arg in (args or [workdir])]
    code = ("import faulthandler, signal; faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            f"import ddp_lib; ddp_lib.launch({str(script)!r}, args={words!r},"
            f" nproc_per_node=2, timeout=300, launcher={launcher!r})")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_workers(workdir: Path, kernel: subprocess.Popen) -> None:
    """Wait until both ranks run the script: a rank still starting Python has not yet registered
    the signal that asks it for its stack, and would die of it without saying where it was."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if len(list(workdir.glob("started.rank*"))) == 2:
            return
        assert kernel.poll() is None, kernel.communicate()
        time.sleep(0.2)
    raise AssertionError("the workers never started")


def stop_kernel_with_sigint(kernel: subprocess.Popen, workdir: Path) -> str:
    """Interrupt the launching "kernel" as Jupyter's stop button does; its stderr.

    The stop takes seconds; launch's own waits add up to about 25 s at worst (a launcher
    ignoring SIGTERM). Longer means it hangs: then the test fails saying where the "kernel" is.
    """
    kernel.send_signal(signal.SIGINT)
    try:
        _, err = kernel.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        still = [command_line(p) for p in processes_mentioning(str(workdir))]
        kernel.send_signal(signal.SIGUSR1)  # faulthandler: every thread's Python stack
        time.sleep(1)
        kernel.kill()
        _, err = kernel.communicate()
        pytest.fail(f"the launch did not stop within 30 s of SIGINT; running: {still}\n{err}")
    assert "LaunchInterrupted" in err  # a KeyboardInterrupt
    return err


def test_interrupt_stops_the_whole_launch(make_script, workdir):
    script = make_script("sleeper.py", SLEEPER)
    kernel = _launch_in_child(workdir, script)
    _wait_for_workers(workdir, kernel)
    err = stop_kernel_with_sigint(kernel, workdir)
    assert "interrupted: torchrun and all its workers were stopped" in err
    assert "Where each rank was:" in err
    assert "rank 1: sleeper.py:6  time.sleep(300)" in err, err
    assert wait_until_gone(str(workdir), within=5) == []


def test_dying_kernel_takes_its_launch_with_it(make_script, workdir):
    script = make_script("sleeper.py", SLEEPER)
    kernel = _launch_in_child(workdir, script)
    _wait_for_workers(workdir, kernel)
    kernel.kill()  # no chance to clean up: the parent-death signal has to do it
    kernel.communicate()
    assert wait_until_gone(str(workdir), within=30) == []


def test_two_launches_at_once_do_not_collide(make_script, workdir):
    script = make_script("allreduce.py", ALL_REDUCE)
    code = (f"import json, ddp_lib; r = ddp_lib.launch({str(script)!r}, nproc_per_node=2, "
            "timeout=180, stream=False); print(json.dumps(r.metric('sum', rank=1)))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    kernels = [subprocess.Popen([sys.executable, "-c", code], cwd=workdir, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    for kernel in kernels:
        out, err = kernel.communicate(timeout=240)
        assert kernel.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == [[1, 3.0]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nproc_per_node": 0}, "nproc_per_node must be an integer >= 1"),
        ({"nproc_per_node": "2"}, "nproc_per_node must be an integer >= 1"),
        ({"nnodes": 0}, "nnodes must be an integer >= 1"),
        ({"max_restarts": -1}, "max_restarts must be an integer >= 0"),
        ({"nnodes": 2}, "every node must be given the same rdzv_endpoint"),
        ({"rdzv_endpoint": "no-port"}, "rdzv_endpoint must look like 'host:port'"),
        ({"timeout": 0}, "timeout must be a positive number"),
        ({"backend": "mpi"}, "backend must be one of"),
        ({"env": {"A": 1}}, "env must map strings to strings"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(make_script, workdir, kwargs, message):
    script = make_script("ok.py", "print('never runs')\n")
    with pytest.raises(ValueError) as info:
        launch(script, **{"nproc_per_node": 1, **kwargs})
    assert message in str(info.value)
    assert not (workdir / "runs").exists()


def test_nccl_without_a_gpu_per_process_is_refused(make_script):
    import torch

    script = make_script("ok.py", "print('never runs')\n")
    too_many = torch.cuda.device_count() + 1
    with pytest.raises(ValueError, match="one CUDA GPU per process|has no NCCL"):
        launch(script, nproc_per_node=too_many, backend="nccl")


def test_missing_script_is_refused(workdir):
    with pytest.raises(FileNotFoundError, match="No script at"):
        launch(workdir / "nope.py", nproc_per_node=1)


def test_launch_nodes_labels_every_rank_with_its_node(make_script, notebook_bars):
    # Lesson 06 checks that both nodes' ranks are shown.
    script = make_script("nodes.py", "import os; print('from rank', os.environ['RANK'])\n")
    result = launch_nodes(script, nnodes=2, nproc_per_node=1, stream=False, timeout=120)
    assert bar_shown(notebook_bars[-1])[0] == "success", "a launch that ended well: green"
    ranks_by_node = {(line.node, line.rank) for line in result.lines
                     if line.text.startswith("from rank")}
    assert {rank for _, rank in ranks_by_node} == {0, 1}
    assert {node for node, _ in ranks_by_node} == {0, 1}  # one rank came through each agent


def test_torchrun_refusing_its_command_line_is_named(make_script, monkeypatch):
    # What torch 2.11's torchrun did with a newer option: no worker ever ran. The message must
    # blame torchrun's command line, not a rank.
    arguments = torchrun.arguments
    monkeypatch.setattr(torchrun, "arguments",
                        lambda *args, **kwargs: ["--no-such-option=1", *arguments(*args, **kwargs)])
    script = make_script("allreduce.py", ALL_REDUCE)
    with pytest.raises(LaunchError) as caught:
        launch(script, nproc_per_node=2, stream=False, timeout=120)
    assert not isinstance(caught.value, RankFailed)
    message = str(caught.value)
    assert message.startswith("torchrun refused its command line")
    assert "--no-such-option" in message


def test_one_machine_is_standalone_and_several_need_an_endpoint():
    assert torchrun.command("t.py", nproc_per_node=2, args=["--epochs", 1]) == [
        "torchrun", "--standalone", "--nproc-per-node=2", "t.py", "--epochs", "1"]
    with pytest.raises(ValueError, match="needs rdzv_endpoint"):
        torchrun.command("t.py", nproc_per_node=2, nnodes=2)


def test_the_notebooks_settings_are_read_by_the_installed_torchrun(monkeypatch):
    from torch.distributed.run import get_args_parser

    for name, value in torchrun.supervision(Path("runs/x/torchrun")).items():
        monkeypatch.setenv(name, value)
    parsed = get_args_parser().parse_args(torchrun.arguments("t.py", nproc_per_node=2))
    assert (parsed.log_dir, parsed.tee, parsed.standalone) == ("runs/x/torchrun", "3", True)
