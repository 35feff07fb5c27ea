"""What only a CUDA GPU can show: NCCL launches, and every notebook at full size on the GPU.

These tests carry the ``gpu`` marker and are skipped, saying why, where no GPU is visible (as in
CI). On a GPU node run them alone with ``python -m pytest -m gpu``: each notebook then executes
in a fresh kernel at full size (``DDP_WORKSHOP_FULL_SIZE=1``), as a learner there would run it,
and passes when every cell, its assertions included, does. How long each takes is a benchmark's
question: ``make bench BENCH_ARGS="--only notebooks"`` times them, at full size on a GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_lib import launch, scripts
from ddp_lib.launching import metrics

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU, and none is visible here"),
]

NCCL_ALL_REDUCE = """
    import os
    import time
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    t = torch.full((1024,), dist.get_rank() + 1.0, device=f"cuda:{local_rank}")
    dist.all_reduce(t)
    n = dist.get_world_size()
    assert t.eq(n * (n + 1) / 2).all(), t[:4]
    print(f"rank {dist.get_rank()} on {t.device}: {t[0].item():g}")
    time.sleep(0.2)  # torch 2.4-2.7 can hang in destroy: pytorch/pytorch#154976
    dist.destroy_process_group()
"""


def test_nccl_all_reduce_on_every_gpu(make_script):
    script = make_script("nccl_allreduce.py", NCCL_ALL_REDUCE)
    result = launch(script, nproc_per_node=GPUS, backend="nccl", timeout=180)
    assert result.ranks() == list(range(GPUS))
    total = GPUS * (GPUS + 1) / 2
    for rank in range(GPUS):
        assert f"rank {rank} on cuda:{rank}: {total:g}" in result.output(rank)


# What a site's wrapper does on an HPC node (ALCF's set_affinity_gpu_polaris.sh, say): each rank
# sees one GPU, its own, and CUDA numbers it 0.
BIND_ONE_GPU = 'export CUDA_VISIBLE_DEVICES=$LOCAL_RANK\nexec "$@"\n'


def test_lesson_05_trains_with_nccl_when_each_rank_sees_only_its_own_gpu(tmp_path):
    """The lessons' device rule on a GPU node that binds a GPU to each rank: NCCL on cuda:0 in
    every rank (NCCL's own log names the device), never Gloo on the CPU."""
    scripts.from_notebook(ROOT / "notebooks" / "05_ddp.ipynb", "train_ddp.py",
                          directory=tmp_path, quiet=True)
    (tmp_path / "bind_one_gpu.sh").write_text(BIND_ONE_GPU)
    metrics_file = tmp_path / "metrics.jsonl"
    env = {**os.environ, "NCCL_DEBUG": "INFO", metrics.ENV_VAR: str(metrics_file),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("DDP_BACKEND", None)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={GPUS}", "--no-python", "sh", "bind_one_gpu.sh", sys.executable,
         "train_ddp.py", "--epochs", "1", "--train-samples", "2048", "--test-samples", "512",
         "--checkpoint", str(tmp_path / "bound.pt")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    devices = re.findall(r"rank (\d+) nranks \d+ cudaDev (\d+)", done.stdout + done.stderr)
    assert {rank for rank, _ in devices} == {str(r) for r in range(GPUS)}, devices
    assert {device for _, device in devices} == {"0"}, "each rank's only GPU is its cuda:0"
    weights = {r["rank"]: r["sha256"] for r in metrics.read(metrics_file)
               if r["name"] == "weights_sum"}
    assert sorted(weights) == list(range(GPUS)) and len(set(weights.values())) == 1


def test_more_processes_than_gpus_train_on_the_cpu_only_when_asked(tmp_path, monkeypatch,
                                                                   capsys):
    """More processes than GPUs: a launch from a notebook plans Gloo and says so in the command
    it prints; the same script under plain torchrun stops with the rule's message, one GPU
    included (NCCL would refuse two ranks on it)."""
    scripts.from_notebook(ROOT / "notebooks" / "00_setup.ipynb", "hello_allreduce.py",
                          directory=tmp_path, quiet=True)
    monkeypatch.chdir(tmp_path)
    nproc = GPUS + 1
    result = launch("hello_allreduce.py", nproc_per_node=nproc, timeout=120)
    assert capsys.readouterr().out.startswith("$ DDP_BACKEND=gloo torchrun ")
    assert all("on cpu, backend gloo" in result.output(rank) for rank in range(nproc))
    env = {k: v for k, v in os.environ.items() if k != "DDP_BACKEND"}
    plain = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc-per-node={nproc}", "hello_allreduce.py"], env=env,
                           capture_output=True, text=True, timeout=180)
    assert plain.returncode != 0
    assert (f"{GPUS} GPU(s) for {nproc} processes on this machine: start one process per GPU "
            f"(--nproc-per-node={GPUS}), or set DDP_BACKEND=gloo") in plain.stderr, \
        plain.stderr[-3000:]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_at_full_size_on_the_gpu(notebook, monkeypatch):
    """Every cell passes at full size: the lessons' own assertions on a GPU (NCCL, AMP, FSDP2)."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("DDP_WORKSHOP_FULL_SIZE", "1")
    nb = nbformat.read(notebook, as_version=4)
    NotebookClient(nb, timeout=1200, kernel_name="python3",
                   resources={"metadata": {"path": str(notebook.parent)}}).execute()
