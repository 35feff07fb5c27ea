"""What only a CUDA GPU can show: NCCL launches, and every notebook at full size on the GPU.

These tests carry the ``gpu`` marker and are skipped, saying why, where no GPU is visible (as in
CI). On a GPU node run them alone with ``python -m pytest -m gpu``: each notebook then executes
in a fresh kernel at full size (``DDP_WORKSHOP_FULL_SIZE=1``), as a learner there would run it,
and its wall time goes to ``build/gpu/notebook_times.json`` for ``docs/benchmarks.md``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from ddp_lib import launch

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
TIMES = ROOT / "build" / "gpu" / "notebook_times.json"
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU, and none is visible here"),
]

NCCL_ALL_REDUCE = """
    import os
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
    dist.destroy_process_group()
"""


def test_nccl_all_reduce_on_every_gpu(make_script):
    script = make_script("nccl_allreduce.py", NCCL_ALL_REDUCE)
    result = launch(script, nproc_per_node=GPUS, backend="nccl", timeout=180)
    assert result.ranks() == list(range(GPUS))
    total = GPUS * (GPUS + 1) / 2
    for rank in range(GPUS):
        assert f"rank {rank} on cuda:{rank}: {total:g}" in result.output(rank)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_at_full_size_on_the_gpu(notebook, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("DDP_WORKSHOP_FULL_SIZE", "1")
    nb = nbformat.read(notebook, as_version=4)
    start = time.monotonic()
    NotebookClient(nb, timeout=1200, kernel_name="python3",
                   resources={"metadata": {"path": str(notebook.parent)}}).execute()
    seconds = time.monotonic() - start
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    times = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    times[notebook.name] = {"seconds": round(seconds, 1), "device": torch.cuda.get_device_name(0),
                            "torch": torch.__version__}
    TIMES.write_text(json.dumps(times, indent=2))
