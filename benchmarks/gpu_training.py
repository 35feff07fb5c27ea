"""On one GPU: ResNet-18 images/s in fp32 vs autocast (AMP), and DDP's cost with one process.

Skipped, with a row saying so, where no CUDA GPU is visible. ``--only gpu`` runs it; the CPU
path of the worker exists only to check that the code runs.
"""

from __future__ import annotations

import torch

import ddp_lib
from benchmarks.common import Table, build_dir, median, worker

GOAL = 0.95  # DDP with one process, as a fraction of the plain model's images/s


def run(quick: bool = False) -> Table:
    headers = ["variant", "images/s", "x fp32 (same round)"]
    title = "One GPU: ResNet-18, batch 256, fp32 vs autocast, plain vs DDP with 1 process"
    if not torch.cuda.is_available():
        print("gpu: skipped, no CUDA GPU is visible to this torch "
              f"({torch.__version__}, CUDA build {torch.version.cuda or 'none'})")
        return Table(title=title, headers=headers,
                     rows=[["skipped: no CUDA GPU visible", "", ""]])
    args = ["--steps", 5 if quick else 20, "--rounds", 2 if quick else 3]
    result = ddp_lib.launch(worker("gpu_throughput.py"), nproc_per_node=1, args=args,
                            run_dir=build_dir("gpu") / "run", stream=False, timeout=1200)
    found: dict[str, list[float]] = {}
    for record in result.metrics:
        found.setdefault(record["variant"], []).append(record["value"])
    rows = [[variant, f"{median(values):.0f}",
             f"{median([v / b for v, b in zip(values, found['fp32'], strict=True)]):.2f}"]
            for variant, values in found.items()]
    ddp = median([v / b for v, b in zip(found["ddp 1 process fp32"], found["fp32"], strict=True)])
    notes = [f"DDP with 1 process (gradient_as_bucket_view, static_graph): {ddp:.2f} x the plain "
             f"model ({'meets' if ddp >= GOAL else 'MISSES'} the goal >= {GOAL})"]
    return Table(title=title, headers=headers, rows=rows, notes=notes, data=found)
