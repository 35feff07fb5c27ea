"""The tracks' capstones: lesson 05's take-home script run on 1 and 2 processes with plain
torchrun, its speed-up recorded; the checklist of the take-home job's log, against a log that
holds and against each way one does not. tests/test_slurm.py submits the kit's own job file to
a real Slurm and checks its log with this checklist."""

from __future__ import annotations

import json

import pytest
from conftest import wait_until_gone

import ddp_lib
from workshop import capstone

GOOD_LOG = """\
job 4242 on n[1-2]; rendezvous at n1:24242
epoch 0: loss 2.190, test accuracy 0.242, 3.1 s, 16129 images/s
epoch 1: loss 1.870, test accuracy 0.331, 2.9 s, 17241 images/s
saved checkpoints/train_ddp.pt
"""


def test_a_finished_jobs_log_passes_the_checklist(tmp_path, capsys):
    log = tmp_path / "ddp-workshop-4242.out"
    log.write_text(GOOD_LOG)
    assert capstone.joblog(log, epochs=2) == 0
    said = capsys.readouterr().out
    assert "✓ the job started on its nodes: job 4242 on n[1-2]" in said
    assert "✓ rank 0 trained all 2 epochs: epochs [0, 1]; the last: test accuracy 0.331" in said


# What a two-node job's log shows when the first node's agent, which serves the rendezvous store,
# leaves before another's exit barrier (tests/test_slurm.py's job showed it; pytorch/pytorch#69520)
EXIT_RACE = """\
E1129 08:48:23.339000 329 torch/distributed/elastic/agent/server/api.py:1008] Error waiting on exit barrier. Elapsed: 0.018 seconds
E1129 08:48:23.339000 329 torch/distributed/elastic/agent/server/api.py:1008] Traceback (most recent call last):
E1129 08:48:23.339000 329 torch/distributed/elastic/agent/server/api.py:1008] torch.distributed.DistNetworkError: Failed to recv, got 0 bytes.
"""  # noqa: E501


def test_the_agents_race_at_exit_is_no_failed_rank(tmp_path, capsys):
    log = tmp_path / "job.out"
    log.write_text(GOOD_LOG + EXIT_RACE)
    assert capstone.joblog(log, epochs=2) == 0
    assert "pytorch/pytorch#69520, not a failed rank" in capsys.readouterr().out


@pytest.mark.parametrize(("log", "epochs", "said"), [
    (GOOD_LOG, 5, "✗ rank 0 trained all 5 epochs: epochs [0, 1]"),
    (GOOD_LOG.replace("saved checkpoints/train_ddp.pt\n", ""), 2, "✗ the checkpoint was written"),
    (GOOD_LOG.splitlines()[0] + "\nTraceback (most recent call last):\n  File ...\n"
     "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n", 2,
     "✗ no rank failed: 'Traceback (most recent call last)' at line 2"),
    ("srun: error: n2: task 1: Exited with exit code 1\n", 2,
     "✗ the job started on its nodes: no 'job ... on ...' line"),
])
def test_each_thing_the_checklist_asks_is_named_when_the_log_lacks_it(tmp_path, capsys, log,
                                                                      epochs, said):
    path = tmp_path / "job.out"
    path.write_text(log)
    assert capstone.joblog(path, epochs=epochs) == 1
    assert said in capsys.readouterr().out


def test_the_speedup_runs_lesson_05s_script_on_1_and_2_processes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(capstone, "OUT", tmp_path)
    monkeypatch.setenv("DDP_WORKSHOP_DATASET", "synthetic")
    found = capstone.speedup(epochs=2, batch_size=32, train_samples=256, nproc=2)
    said = capsys.readouterr().out
    assert found == json.loads((tmp_path / "speedup.json").read_text())
    assert set(found["images_per_s"]) == {"1", "2"} and all(
        value > 0 for value in found["images_per_s"].values())
    assert found["speedup"] == pytest.approx(found["images_per_s"]["2"]
                                             / found["images_per_s"]["1"])
    # The torchrun commands, printed as run, on the take-home folder's script: the same batch
    # per process, N times the samples.
    one, two = found["commands"]
    assert "--nproc-per-node=1" in one and "take-home/train_ddp.py" in one \
        and "--train-samples 256" in one
    assert "--nproc-per-node=2" in two and "--train-samples 512" in two
    assert "--nproc-per-node=1" in said and "--nproc-per-node=2" in said  # printed as run
    assert not list(tmp_path.glob("*.partial"))


def test_a_run_cut_short_is_stopped_whole(tmp_path, monkeypatch):
    from workshop import take_home

    monkeypatch.setattr(capstone, "OUT", tmp_path)
    folder = take_home.build(tmp_path / "take-home")
    with pytest.raises(ddp_lib.LaunchTimeout):
        capstone.one_run(folder, 2, ["--epochs", "50"], timeout=8)
    assert not wait_until_gone(str(folder), within=10), "torchrun and its ranks are gone"
