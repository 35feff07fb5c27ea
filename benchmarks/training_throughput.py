"""Training throughput and DDP scaling on the CPU, and what cutting communication buys.

One launch per model (``workers/train_throughput.py``) measures every variant in interleaved
rounds: one process with 1 thread (the per-process baseline) and with N threads, and DDP with N
processes of 1 thread each: as the lessons use it, without gradient communication (``no_sync``,
the upper bound), with fp16/bf16 gradient compression hooks, PowerSGD, and other bucket sizes.

Scaling efficiency = throughput_N / (N * throughput_1), throughput_1 being one 1-thread process
on the per-process batch, measured in the same rounds. A second launch trains the small CNN
briefly with each gradient format to show what compression does to accuracy.
"""

from __future__ import annotations

import ddp_lib
from benchmarks.common import Table, build_dir, median, worker

GOAL = 0.85  # ResNet-18 DDP on 2 CPU ranks, best practical variant, as a fraction of ideal


def throughput(model: str, nprocs: int, quick: bool, folder) -> dict[str, list[float]]:
    """images/s per variant and round (rank 0's clock), from one launch."""
    args = ["--model", model, "--batch-size", 64]
    if model == "smallcnn":  # milliseconds per step: many steps per round
        args += ["--rounds", 3 if quick else 5, "--steps", 10 if quick else 20]
    else:  # seconds per step on one CPU thread
        args += ["--rounds", 2 if quick else 5, "--steps", 1, "--warmup", 1]
    result = ddp_lib.launch(worker("train_throughput.py"), nproc_per_node=nprocs, backend="gloo",
                            args=args, run_dir=folder / f"{model}-{nprocs}", stream=False,
                            timeout=1200)
    found: dict[str, list[float]] = {}
    for record in result.metrics:
        if record["name"] == "images_per_s":
            found.setdefault(record["variant"], []).append(record["value"])
    waiting = [r["value"] for r in result.metrics if r["name"] == "waiting_cpu_fraction"]
    found["waiting ranks CPU use"] = waiting
    return found


def accuracy(nprocs: int, quick: bool, folder) -> dict[str, float]:
    args = ["--accuracy", "--epochs", 2 if quick else 5]
    result = ddp_lib.launch(worker("train_throughput.py"), nproc_per_node=nprocs, backend="gloo",
                            args=args, run_dir=folder / "accuracy", stream=False, timeout=1200)
    return {r["variant"]: r["value"] for r in result.metrics if r["name"] == "test_accuracy"}


def _efficiency(values: list[float], solo: list[float], nprocs: int) -> float:
    """Median over rounds of throughput / (N x the same round's 1-thread process)."""
    return median([v / (nprocs * s) for v, s in zip(values, solo, strict=True)])


def run(quick: bool = False, nprocs: int = 2) -> Table:
    folder = build_dir("training")
    rows, notes, data = [], [], {}
    for model in ("smallcnn", "resnet18"):
        found = throughput(model, nprocs, quick, folder)
        data[model] = found
        solo = found["solo 1 thread"]
        for variant, values in found.items():
            if variant.startswith("loader") or variant.startswith("waiting"):
                continue
            efficiency = _efficiency(values, solo, nprocs)
            rows.append([model, variant, f"{median(values):.1f}", f"{efficiency:.2f}"])
        for variant in ("loader PIL + transforms", "loader pre-decoded"):
            rows.append([model, f"input only: {variant}", f"{median(found[variant]):.0f}", ""])
        if model == "resnet18":
            best = max((v for v in found if v.startswith("ddp") and v != "ddp no_sync"),
                       key=lambda v: _efficiency(found[v], solo, nprocs))
            best_eff = _efficiency(found[best], solo, nprocs)
            plain = _efficiency(found["ddp"], solo, nprocs)
            verdict = "meets" if best_eff >= GOAL else "MISSES"
            notes.append(f"ResNet-18, {nprocs} ranks: plain DDP {plain:.2f} x ideal; best "
                         f"variant '{best}' {best_eff:.2f} x ideal ({verdict} the goal >= {GOAL})")
        notes.append(f"{model}: CPU use of the waiting ranks while rank 0 trained alone: "
                     f"{max(found['waiting ranks CPU use']):.1%} at most")
    accuracies = accuracy(nprocs, quick, folder)
    data["accuracy"] = accuracies
    notes.append("Small CNN, same short training, test accuracy by gradient format: "
                 + ", ".join(f"{k.removeprefix('ddp ') if k != 'ddp' else 'fp32'} "
                             f"{v:.3f}" for k, v in accuracies.items()))
    return Table(
        title=f"Training throughput, {nprocs} CPU processes x 1 thread, batch 64 per process "
              "(median of interleaved rounds)",
        headers=["model", "variant", "images/s", "x ideal (N x 1-thread process)"],
        rows=rows, notes=notes, data=data)
