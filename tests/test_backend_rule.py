"""One device rule, ``course_helpers.backend_and_device``, written once and called by every lesson
script, on each machine a learner has: a CPU machine, one GPU shared by several processes, a
launcher that gives each rank its own GPU, all of a machine's GPUs visible.

The rule runs here on fake machines (the GPU count is faked; the environment, the parent
process and the launches are real), and a launch from a notebook (``plan``, with the
``DDP_BACKEND`` it passes) makes it choose as planned.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import course_helpers
from ddp_lib import hardware, scripts

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture
def machine(monkeypatch):
    """A machine where this process sees ``gpus`` GPUs, started as ``local_rank`` of
    ``local_world_size``; ``own`` says whether a launcher set its GPU for it alone."""
    chosen = []

    def make(gpus: int, local_rank: int = 0, local_world_size: int = 1, own: bool = False,
             backend: str | None = None):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
        monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
        monkeypatch.setattr(torch, "set_num_threads", lambda n: chosen.append(("threads", n)))
        monkeypatch.setattr(course_helpers, "gpu_set_for_this_process", lambda: own)
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world_size))
        if backend is None:
            monkeypatch.delenv("DDP_BACKEND", raising=False)
        else:
            monkeypatch.setenv("DDP_BACKEND", backend)
        return chosen

    return make


def test_no_gpu_trains_on_the_cpu_with_gloo_and_its_share_of_the_cores(machine):
    chosen = machine(gpus=0, local_rank=1, local_world_size=2)
    assert course_helpers.backend_and_device() == ("gloo", torch.device("cpu"))
    assert chosen == [("threads", course_helpers.threads_per_process(2))]
    assert course_helpers.backend_and_device(threads=3) == ("gloo", torch.device("cpu"))
    assert chosen[-1] == ("threads", 3)


def test_all_gpus_visible_each_rank_takes_its_local_rank(machine):
    for local_rank in range(4):
        chosen = machine(gpus=4, local_rank=local_rank, local_world_size=4)
        assert course_helpers.backend_and_device() == ("nccl", torch.device("cuda", local_rank))
        assert chosen[-1] == torch.device("cuda", local_rank)


def test_one_gpu_per_rank_from_the_launcher_takes_cuda_0(machine):
    # srun --gpus-per-task=1, mpiexec -gpus-per-proc 1, a site's wrapper script: each of the 4
    # processes of the machine sees one GPU, its own, as cuda:0.
    for local_rank in range(4):
        machine(gpus=1, local_rank=local_rank, local_world_size=4, own=True)
        assert course_helpers.backend_and_device() == ("nccl", torch.device("cuda", 0))


@pytest.mark.parametrize("gpus", [1, 2])
def test_fewer_gpus_than_processes_stops_with_the_way_out(machine, gpus):
    # One GPU shared by two processes is the one-GPU laptop: NCCL would refuse it
    # ("Duplicate GPU detected"), so the rule stops first and says what to do.
    machine(gpus=gpus, local_rank=1, local_world_size=gpus + 1)
    expected = (rf"^{gpus} GPU\(s\) for {gpus + 1} processes on this machine: start one process "
                rf"per GPU \(--nproc-per-node={gpus}\), or set DDP_BACKEND=gloo to train on the "
                r"CPU$")
    with pytest.raises(RuntimeError, match=expected):
        course_helpers.backend_and_device()
    machine(gpus=gpus, local_rank=1, local_world_size=gpus + 1, backend="gloo")
    assert course_helpers.backend_and_device() == ("gloo", torch.device("cpu"))


def test_one_gpu_one_process_uses_it(machine):
    machine(gpus=1)
    assert course_helpers.backend_and_device() == ("nccl", torch.device("cuda", 0))


def test_a_gpu_job_without_its_gpus_fails_instead_of_training_on_the_cpu(machine):
    machine(gpus=0, local_world_size=4, backend="nccl")
    with pytest.raises(RuntimeError, match=r"^DDP_BACKEND=nccl, but this process sees no GPU"):
        course_helpers.backend_and_device()


def fake_machine(gpus: int) -> hardware.Hardware:
    return hardware.Hardware(cpu_cores=8, cpu_model="test", cuda_gpus=gpus,
                             gpu_names=("GPU",) * gpus, nccl_available=True,
                             gloo_available=True, torch_version="test", cuda_version="13.0")


def test_a_course_launch_makes_the_rule_choose_as_planned(machine):
    """The kernel sees all of the machine's GPUs; plan() chooses Gloo where there are fewer
    GPUs than processes, and passes DDP_BACKEND, printed with the command."""
    for gpus in range(4):
        for processes in range(1, 5):
            planned = hardware.plan(processes, hw=fake_machine(gpus))
            for local_rank in range(processes):
                machine(gpus=gpus, local_rank=local_rank, local_world_size=processes,
                        backend=planned.env().get("DDP_BACKEND"))
                backend, device = course_helpers.backend_and_device()
                assert (backend, device.type) == (planned.backend, planned.device_type), \
                    (gpus, processes)


def test_plan_passes_the_backend_only_where_the_rule_would_choose_otherwise():
    assert hardware.plan(2, hw=fake_machine(0)).env() == {}
    assert hardware.plan(2, hw=fake_machine(2)).env() == {}
    assert hardware.plan(2, hw=fake_machine(1)).env() == {"DDP_BACKEND": "gloo"}
    assert hardware.plan(2, "gloo", hw=fake_machine(0)).env() == {"DDP_BACKEND": "gloo"}


# --- Whether a launcher chose this process's GPU, asked of real processes ----------------------

ASK = "import course_helpers; print(course_helpers.gpu_set_for_this_process())"


def ask_child(parent_env: dict[str, str], child_line: str) -> str:
    """Start a parent shell with ``parent_env``, which starts Python after ``child_line``."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(["sh", "-c", f'{child_line} "{sys.executable}" -c "{ASK}"'],
                          env={**env, **parent_env}, capture_output=True, text=True, timeout=60,
                          check=True)
    return done.stdout.strip()


def test_a_gpu_set_per_process_is_told_from_an_inherited_one():
    assert ask_child({}, "") == "False"  # nothing set: the machine's GPUs, shared
    assert ask_child({"CUDA_VISIBLE_DEVICES": "0"}, "") == "False"  # inherited, as torchrun's
    assert ask_child({}, "CUDA_VISIBLE_DEVICES=1") == "True"  # set for this process alone
    assert ask_child({"CUDA_VISIBLE_DEVICES": "0,1"}, "CUDA_VISIBLE_DEVICES=1") == "True"


# --- Every script follows it --------------------------------------------------------------------

def written_scripts() -> list[tuple[str, str, str]]:
    """(notebook, script, text) for every script a notebook's cells write (whole, where a cell
    holds a change to another script)."""
    found = []
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            first, _, body = "".join(cell["source"]).partition("\n")
            if cell["cell_type"] == "code" and scripts.header(first):
                found.append((path.name, scripts.header(first)[0], scripts.script_of(first, body)))
    return found


SCRIPTS = written_scripts()


def test_every_script_that_joins_a_group_takes_its_backend_from_the_rule():
    chooses = [(notebook, name) for notebook, name, text in SCRIPTS
               if re.search(r"init_process_group\(backend\b", text)]
    assert len(chooses) >= 25, chooses
    for notebook, name, text in SCRIPTS:
        assert "torch.cuda.device_count()" not in text, f"{notebook} {name}: a rule of its own"
        if (notebook, name) in chooses:
            assert "backend, device = backend_and_device(" in text, f"{notebook} {name}"


# --- The rule in real launches on a machine faked to show one GPU ------------------------------

ONE_GPU = """
import torch

torch.cuda.device_count = lambda: 1  # a machine with one GPU, as the ranks see it
torch.cuda.set_device = lambda device: None
"""

PROBE = """
import os

from course_helpers import backend_and_device

backend, device = backend_and_device()
print(f"rank {os.environ['RANK']}: {backend} on {device}")
"""


def launch_on_one_gpu(tmp_path: Path, *command: str, env: dict[str, str] | None = None):
    fake = tmp_path / "fake"
    fake.mkdir(exist_ok=True)
    (fake / "sitecustomize.py").write_text(textwrap.dedent(ONE_GPU))
    (tmp_path / "probe.py").write_text(textwrap.dedent(PROBE))
    base = {k: v for k, v in os.environ.items()
            if k not in ("CUDA_VISIBLE_DEVICES", "DDP_BACKEND", "DDP_LIB_METRICS_FILE")}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(fake), str(ROOT),
                                                       base.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", *command], cwd=tmp_path,
                          env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=180)


def test_one_gpu_two_processes_under_torchrun_names_the_way_out(tmp_path):
    done = launch_on_one_gpu(tmp_path, "probe.py")
    assert done.returncode != 0
    assert "RuntimeError: 1 GPU(s) for 2 processes on this machine: start one process per " \
           "GPU (--nproc-per-node=1), or set DDP_BACKEND=gloo" in done.stderr, done.stderr[-3000:]
    chose_gloo = launch_on_one_gpu(tmp_path, "probe.py", env={"DDP_BACKEND": "gloo"})
    assert chose_gloo.returncode == 0, chose_gloo.stderr[-3000:]
    assert {f"rank {r}: gloo on cpu" for r in (0, 1)} <= set(chose_gloo.stdout.splitlines())


def test_a_wrapper_that_gives_each_rank_its_gpu_gets_nccl_on_cuda_0(tmp_path):
    # What a site's script does (ALCF's set_affinity_gpu_polaris.sh, under mpiexec there).
    (tmp_path / "bind_one_gpu.sh").write_text('export CUDA_VISIBLE_DEVICES=$LOCAL_RANK\n'
                                              'exec "$@"\n')
    done = launch_on_one_gpu(tmp_path, "--no-python", "sh", "bind_one_gpu.sh", sys.executable,
                             "probe.py")
    assert done.returncode == 0, done.stderr[-3000:]
    assert {f"rank {r}: nccl on cuda:0" for r in (0, 1)} <= set(done.stdout.splitlines())


def test_lesson_00s_script_on_one_gpu_stops_before_nccl_refuses(tmp_path):
    from ddp_lib import scripts

    scripts.from_notebook(ROOT / "notebooks" / "00_setup.ipynb", "hello_allreduce.py",
                          directory=tmp_path, quiet=True)
    done = launch_on_one_gpu(tmp_path, "hello_allreduce.py")
    assert done.returncode != 0
    assert "1 GPU(s) for 2 processes on this machine" in done.stderr, done.stderr[-3000:]
    assert "Duplicate GPU" not in done.stderr + done.stdout
