"""The backend/device decision and the course sizes, for machines we do and do not have."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import course_helpers
from ddp_lib import hardware
from ddp_lib.hardware import Hardware

ROOT = Path(__file__).resolve().parents[1]


def machine(gpus: int, cores: int = 8, nccl: bool = True) -> Hardware:
    return Hardware(cpu_cores=cores, cpu_model="test CPU", cuda_gpus=gpus,
                    gpu_names=tuple(f"GPU {i}" for i in range(gpus)), nccl_available=nccl,
                    gloo_available=True, torch_version="2.x", cuda_version="13.0" if gpus else None)


def test_cpu_laptop_uses_gloo_and_splits_the_cores():
    plan = hardware.plan(None, hw=machine(gpus=0, cores=2))
    assert (plan.nproc_per_node, plan.backend, plan.device_type) == (2, "gloo", "cpu")
    assert plan.threads_per_process == 1
    assert "no CUDA GPU" in plan.reason


def test_one_gpu_per_process_uses_nccl():
    plan = hardware.plan(None, hw=machine(gpus=4))
    assert (plan.nproc_per_node, plan.backend, plan.device_type) == (4, "nccl", "cuda")
    assert "cuda:0 .. cuda:3" in plan.summary()


def test_more_processes_than_gpus_falls_back_to_gloo_and_says_why():
    plan = hardware.plan(2, hw=machine(gpus=1, cores=8))
    assert (plan.backend, plan.device_type, plan.threads_per_process) == ("gloo", "cpu", 4)
    assert "NCCL needs one GPU per process" in plan.reason


def test_gloo_can_be_forced_on_gpus():
    plan = hardware.plan(2, backend="gloo", hw=machine(gpus=2))
    assert plan.backend == "gloo" and "asked for" in plan.reason


@pytest.mark.parametrize(("hw", "match"), [
    (machine(gpus=1), "needs one CUDA GPU per process"),
    (machine(gpus=4, nccl=False), "has no NCCL"),
])
def test_nccl_is_refused_where_it_cannot_work(hw, match):
    with pytest.raises(ValueError, match=match):
        hardware.plan(2, backend="nccl", hw=hw)


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "2"])
def test_nonsense_process_counts_are_refused(n):
    with pytest.raises(ValueError, match="integer >= 1"):
        hardware.plan(n, hw=machine(gpus=0))


def test_threads_per_process_reads_torchruns_local_world_size(monkeypatch):
    cores = course_helpers.usable_cpu_cores()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert course_helpers.threads_per_process() == max(1, cores // 2)
    assert course_helpers.threads_per_process(cores * 4) == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert course_helpers.threads_per_process() == cores


def test_cores_a_launcher_bound_to_a_process_are_not_divided_again(monkeypatch):
    """srun -c 16 with task affinity, mpiexec -bind-to core:16: the rank's mask is its own share,
    narrower than its parent's. torchrun's workers share torchrun's mask, and divide it."""
    masks = {0: set(range(16)), os.getppid(): set(range(64))}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: masks[pid])
    monkeypatch.setattr(course_helpers, "cpu_quota", lambda: None)
    assert course_helpers.threads_per_process(4) == 16
    masks[os.getppid()] = set(range(16))  # a torchrun worker: the same mask as its parent
    assert course_helpers.threads_per_process(4) == 4


def test_a_narrowed_mask_is_seen_from_inside_a_real_process():
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two usable cores")
    one = min(os.sched_getaffinity(0))
    ask = "import course_helpers as c; print(c.usable_cpu_cores(), c.bound_by_launcher())"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bound = subprocess.run(["taskset", "-c", str(one), sys.executable, "-c", ask], env=env,
                           capture_output=True, text=True, timeout=60, check=True)
    assert bound.stdout.split() == ["1", "True"]  # one core, narrowed for it alone
    shared = subprocess.run(["taskset", "-c", str(one), "sh", "-c", f'"{sys.executable}" -c '
                             f'"{ask}"; true'], env=env, capture_output=True, text=True, timeout=60,
                            check=True)
    assert shared.stdout.split() == ["1", "False"]  # sh was narrowed; Python shares its core


def test_a_containers_cpu_quota_caps_the_cores(tmp_path, monkeypatch):
    (tmp_path / "cgroup").write_text("0::/kubepods/pod1/box\n")
    root = tmp_path / "fs"
    (root / "kubepods" / "pod1" / "box").mkdir(parents=True)
    (root / "kubepods" / "pod1" / "box" / "cpu.max").write_text("max 100000\n")
    assert course_helpers.cpu_quota(tmp_path / "cgroup", root) is None
    (root / "kubepods" / "pod1" / "cpu.max").write_text("250000 100000\n")  # limits.cpu: 2.5
    assert course_helpers.cpu_quota(tmp_path / "cgroup", root) == 3
    (root / "kubepods" / "cpu.max").write_text("100000 100000\n")
    assert course_helpers.cpu_quota(tmp_path / "cgroup", root) == 1  # the tightest counts
    (tmp_path / "cgroup").write_text("4:cpu:/\n")  # cgroup v1 only: no answer
    assert course_helpers.cpu_quota(tmp_path / "cgroup", root) is None
    monkeypatch.setattr(course_helpers, "cpu_quota", lambda: 1)
    assert course_helpers.usable_cpu_cores() == 1


def test_detect_describes_this_machine():
    hw = hardware.detect()
    assert hw.cpu_cores >= 1 and hw.gloo_available
    text = hw.summary()
    assert "CPU" in text and "GPUs" in text and hw.torch_version in text


def test_course_sizes_small_on_cpu_full_on_gpu(monkeypatch):
    monkeypatch.delenv("DDP_WORKSHOP_FULL_SIZE", raising=False)
    small, full = hardware.course_sizes(machine(gpus=0)), hardware.course_sizes(machine(gpus=1))
    assert not small.full_size and full.full_size
    assert small.train_samples < full.train_samples
    monkeypatch.setenv("DDP_WORKSHOP_FULL_SIZE", "1")
    assert hardware.course_sizes(machine(gpus=0)).full_size


def test_full_size_is_the_data_set_on_disk_not_cifar10s_size(monkeypatch):
    # Offline the stand-in has fewer images than CIFAR-10's 50,000 + 10,000: a plan of 50,000
    # would be sliced down silently, and the lessons would print and check sizes never trained.
    monkeypatch.setenv("DDP_WORKSHOP_DATASET", "synthetic")
    monkeypatch.setenv("DDP_WORKSHOP_FULL_SIZE", "1")
    full = hardware.course_sizes(machine(gpus=1))
    assert (full.train_samples, full.test_samples) == (course_helpers.SYNTHETIC_TRAIN,
                                                    course_helpers.SYNTHETIC_TEST)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads are listed from /proc")
def test_thread_ids_lists_every_thread_of_the_process():
    # A fresh process; it may start and end threads of its own meanwhile (an import's pool), so
    # the test follows one thread by its id: listed while it runs, gone once it has ended (the
    # kernel lists a thread until it has exited, a moment after join() returns: waited for).
    program = (
        "import threading, time\n"
        "from course_helpers import thread_ids\n"
        "before = thread_ids()\n"
        "stop = threading.Event()\n"
        "worker = threading.Thread(target=stop.wait)\n"
        "worker.start()\n"
        "during = thread_ids()\n"
        "stop.set()\n"
        "worker.join()\n"
        "deadline = time.monotonic() + 30\n"
        "while worker.native_id in thread_ids() and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print(threading.get_native_id() in before, worker.native_id in during,\n"
        "      worker.native_id in thread_ids())\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1]).stdout
    assert out.split() == ["True", "True", "False"], out


def test_tf32_switches_convolutions_off_within_the_block_and_restores_them():
    before = hardware.tf32_convolutions()
    with hardware.tf32(False):
        assert hardware.tf32_convolutions() is False
        with hardware.tf32(True):
            assert hardware.tf32_convolutions() is True
        assert hardware.tf32_convolutions() is False
    assert hardware.tf32_convolutions() == before


def test_tf32_restores_the_flags_when_the_block_fails():
    flags, _ = hardware._tf32_flags()
    before = [getattr(obj, name) for obj, name in flags]
    with pytest.raises(RuntimeError, match="inside"), hardware.tf32(False):
        raise RuntimeError("inside")
    assert [getattr(obj, name) for obj, name in flags] == before
