"""Launches with MPICH's ``mpiexec`` instead of torchrun (``launch(..., launcher="mpiexec")``).

The ranks find themselves in mpiexec's variables (``PMI_RANK``, ``PMI_SIZE``), as lesson 10's
script does. What the launch adds to mpiexec is checked here against the real one, which the
course's set-up installs: each line labelled with its rank; a rank that raises named from its
traceback, and the others stopped (mpiexec alone leaves them waiting in their next collective); a
crash named with its rank and line; a hung job's stacks; and no process left after an interrupt
or a dying kernel.
"""

from __future__ import annotations

import signal
import time

import pytest
from conftest import wait_until_gone
from test_launch import _launch_in_child, _wait_for_workers, stop_kernel_with_sigint

from ddp_lib import LaunchTimeout, RankFailed, launch

RANKS = """
    import os, signal, sys, time
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from course_helpers import report

    rank, world = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    os.environ["RANK"] = str(rank)  # course_helpers.report reads it
    dist.init_process_group("gloo", rank=rank, world_size=world)
    Path(sys.argv[1], f"started.rank{rank}").touch()
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    print("rank", rank, "of", world, "got", total.item())
    report("sum", total.item())
    if rank == 1 and sys.argv[2] == "raise":
        raise ValueError("rank one gives up")
    if rank == 1 and sys.argv[2] == "crash":
        import ctypes
        ctypes.string_at(0)
    if rank == 1 and sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[2] == "hang":
        time.sleep(300)
    if rank == 0 and sys.argv[2] in ("kill", "raise"):
        # Not a collective, where Gloo would raise "Connection closed by peer" at once: after a
        # kill, on a busy machine, that error could beat mpiexec, which kills this rank for rank
        # 1's signal; after a raise, only the launch stops this rank.
        time.sleep(60)
    dist.all_reduce(total)  # rank 0 waits here for a rank 1 that failed
    time.sleep(0.2)  # torch 2.4-2.7 can hang in destroy: pytorch/pytorch#154976
    dist.destroy_process_group()
"""


def test_an_mpiexec_launch_labels_each_rank_and_collects_metrics(make_script, workdir, capsys):
    script = make_script("ranks.py", RANKS)
    result = launch(script, args=[workdir, "finish"], nproc_per_node=2, launcher="mpiexec",
                    timeout=120)
    assert result.ok and result.ranks() == [0, 1]
    assert result.command == ["mpiexec", "-n", "2", "python", str(script), str(workdir), "finish"]
    shown = capsys.readouterr().out
    first = shown.splitlines()[0]
    assert first.startswith("$ MASTER_ADDR=127.0.0.1 MASTER_PORT=") and first.endswith(
        f"mpiexec -n 2 python {script} {workdir} finish"), first
    # One print of several values is one line: the ranks line-buffer under mpiexec.
    assert "[rank1] rank 1 of 2 got 3.0" in shown.splitlines()
    assert result.metric("sum", rank=1) == [(None, 3.0)]


def test_a_rank_that_raises_stops_the_others_and_is_named(make_script, workdir):
    script = make_script("ranks.py", RANKS)
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        launch(script, args=[workdir, "raise"], nproc_per_node=2, launcher="mpiexec",
               timeout=120, stream=False)
    assert time.monotonic() - start < 30, "rank 0 waited for rank 1 until the timeout"
    # From the ranks' own tracebacks: MPICH keeps no exit code per rank, and no error file.
    assert info.value.rank == 1 and info.value.exitcode is None
    message = str(info.value)
    assert message.startswith("Rank 1 raised an exception while running ranks.py"), message
    assert 'raise ValueError("rank one gives up")' in message, message
    listed = message.split("What each rank did, in order:\n")[1]
    assert listed.index("rank 1: ValueError: rank one gives up") < listed.index(
        "the launch stopped mpiexec and every rank still running"), listed
    assert wait_until_gone(str(workdir), within=5) == []


def test_a_crash_is_named_with_its_rank_and_line(make_script, workdir):
    script = make_script("ranks.py", RANKS)
    with pytest.raises(RankFailed) as info:
        launch(script, args=[workdir, "crash"], nproc_per_node=2, launcher="mpiexec",
               timeout=120, stream=False)
    message = str(info.value)
    assert info.value.rank == 1 and "killed by SIGSEGV" in message, message
    assert "It crashed at ranks.py:20  ctypes.string_at(0)" in message, message
    assert "[rank1]" not in message  # mpiexec's labels inside faulthandler's pieces are gone


def test_a_rank_killed_without_a_trace_is_said_as_such(make_script, workdir):
    script = make_script("ranks.py", RANKS)
    with pytest.raises(RankFailed) as info:
        launch(script, args=[workdir, "kill"], nproc_per_node=2, launcher="mpiexec",
               timeout=120, stream=False)
    assert "A rank (mpiexec does not say which) was killed by SIGKILL" in str(info.value)
    assert wait_until_gone(str(workdir), within=5) == []


@pytest.mark.sweep  # the interrupt test below asks for the stacks the same way, in less time
def test_a_hung_mpiexec_job_says_where_each_rank_was(make_script, workdir):
    script = make_script("ranks.py", RANKS)
    with pytest.raises(LaunchTimeout) as info:
        launch(script, args=[workdir, "hang"], nproc_per_node=2, launcher="mpiexec",
               timeout=15, stream=False)
    message = str(info.value)
    assert "mpiexec and all its ranks were stopped" in message
    for rank in (0, 1):
        assert f"rank {rank}: ranks.py:24  time.sleep(300)" in message, message
    assert wait_until_gone(str(workdir), within=5) == []


def test_an_interrupt_stops_mpiexec_and_its_ranks(make_script, workdir):
    script = make_script("ranks.py", RANKS)
    kernel = _launch_in_child(workdir, script, args=[workdir, "hang"], launcher="mpiexec")
    _wait_for_workers(workdir, kernel)
    err = stop_kernel_with_sigint(kernel, workdir)
    assert "interrupted: mpiexec and all its ranks were stopped" in err
    assert "rank 1: ranks.py:24  time.sleep(300)" in err, err
    assert wait_until_gone(str(workdir), within=5) == []


def test_a_dying_kernel_takes_mpiexec_and_its_ranks_with_it(make_script, workdir):
    script = make_script("ranks.py", RANKS)
    kernel = _launch_in_child(workdir, script, args=[workdir, "hang"], launcher="mpiexec")
    _wait_for_workers(workdir, kernel)
    kernel.send_signal(signal.SIGKILL)  # no chance to clean up: the parent-death signal must
    kernel.communicate()
    assert wait_until_gone(str(workdir), within=30) == []


def test_torchruns_options_are_refused_with_mpiexec(make_script):
    script = make_script("ranks.py", RANKS)
    refused = "launcher='mpiexec' takes no nnodes, rdzv_endpoint, max_restarts"
    with pytest.raises(ValueError, match=refused):
        launch(script, nnodes=2, rdzv_endpoint="h:1", max_restarts=1, launcher="mpiexec")
    with pytest.raises(ValueError, match="launcher must be one of"):
        launch(script, launcher="srun")
