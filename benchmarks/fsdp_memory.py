"""FSDP2 against DDP on 2 CPU processes: memory per rank and step time, lesson 11's zero_ladder.py.

The script is written from lesson 11's ``%%write_script zero_ladder.py`` cell at run time
(``ddp_lib.scripts.from_notebook``), so the figures are those of the code learners run. It
trains one MLP (``--width`` x ``--width`` linear layers, ``--depth`` of them, fp32, AdamW) four
ways, one launch each, and each rank reports what it holds:

* ``ddp``: every rank keeps the weights, the gradients and AdamW's two moments (lesson 05);
* ``zero1``: DDP with ``ZeroRedundancyOptimizer``, each rank keeps 1/N of AdamW's state;
* ``zero2``: FSDP2 with ``reshard_after_forward=False``, everything sharded, the gathered weights
  kept from forward to backward;
* ``zero3``: FSDP2's default, ``reshard_after_forward=True``, each layer's weights freed after its
  forward and gathered again for its backward.

``ddp`` against ``zero3`` is the comparison; ``zero1`` and ``zero2`` are the steps between. The
launches are interleaved in rounds (ddp zero1 zero2 zero3 ddp ...), so a load change on a shared
machine hits every strategy alike; a strategy's step time against DDP's is taken per round, then
the median over rounds. The bytes do not depend on the load: they come from the last round.
"""

from __future__ import annotations

import torch

import course_helpers
import ddp_lib
from benchmarks.common import ROOT, Table, build_dir, median
from ddp_lib import scripts
from ddp_lib.launching import messages

STRATEGIES = {
    "ddp": "DDP",
    "zero1": "ZeRO-1: DDP + ZeroRedundancyOptimizer",
    "zero2": "ZeRO-2: FSDP2, reshard_after_forward=False",
    "zero3": "ZeRO-3: FSDP2 (its default, reshard_after_forward=True)",
}
STORED = ("parameter_bytes", "gradient_bytes", "optimizer_bytes")  # kept between steps
AFTER_FORWARD = "parameter_bytes_after_forward"  # weights held from forward to backward
FSDP2 = ("zero2", "zero3")  # older torch releases cannot run these on the CPU (lesson 11)
MIB = 2**20


def one_launch(script, strategy: str, width: int, depth: int, batch: int, steps: int,
               folder) -> dict[str, float]:
    """What the script reports, for the rank that holds the most or waits the longest."""
    result = ddp_lib.launch(
        script, nproc_per_node=2, backend="gloo", stream=False, timeout=900,
        args=["--strategy", strategy, "--width", width, "--depth", depth, "--batch-size", batch,
              "--steps", steps, "--trace", folder / "trace"],
        run_dir=folder / "run")
    return {name: max(result.metric(name, rank)[-1][1] for rank in result.ranks())
            for name in (*STORED, AFTER_FORWARD, "step_ms")}


def ratios(values: list[float], baseline: list[float]) -> list[float]:
    """Each round's value over the baseline's in the same round."""
    return [v / b for v, b in zip(values, baseline, strict=True)]


def rows_of(found: dict[str, list[dict[str, float]]], failed: dict[str, str]) -> list[list[str]]:
    """One table row per strategy: MiB per rank, step time, and both against DDP's."""
    ddp = found["ddp"]
    base = ddp[-1]
    base_stored = sum(base[k] for k in STORED)
    rows = []
    for strategy, name in STRATEGIES.items():
        if strategy in failed:
            rows.append([name, f"did not run with torch {torch.__version__}: {failed[strategy]}",
                         "", "", "", "", ""])
            continue
        launches = found[strategy]
        last = launches[-1]
        stored = sum(last[k] for k in STORED)
        steps = [launch["step_ms"] for launch in launches]
        against_ddp = ratios(steps, [launch["step_ms"] for launch in ddp])
        rows.append([
            name,
            " + ".join(f"{last[k] / MIB:.0f}" for k in STORED) + f" = {stored / MIB:.0f}",
            f"{stored / base_stored:.2f}",
            f"{last[AFTER_FORWARD] / MIB:.0f}",
            f"{last[AFTER_FORWARD] / base[AFTER_FORWARD]:.2f}",
            f"{median(steps):.0f} ({min(steps):.0f}–{max(steps):.0f})",
            f"{median(against_ddp):.2f} ({min(against_ddp):.2f}–{max(against_ddp):.2f})",
        ])
    return rows


def run(quick: bool = False) -> Table:
    folder = build_dir("fsdp")
    script = scripts.from_notebook(ROOT / "notebooks" / "11_fsdp.ipynb", "zero_ladder.py",
                                   directory=folder, quiet=True)
    # --quick: the lesson's own size; else 4 times the parameters. The script times the steps
    # from the third to the fourth-last (the last three are profiled).
    width, depth, batch, steps, rounds = (1024, 8, 32, 8, 1) if quick else (2048, 8, 32, 10, 3)
    found: dict[str, list[dict[str, float]]] = {strategy: [] for strategy in STRATEGIES}
    failed: dict[str, str] = {}  # FSDP2 strategy -> why it did not train with this torch
    for round_index in range(rounds):
        for strategy in [s for s in STRATEGIES if s not in failed]:
            try:
                found[strategy].append(one_launch(script, strategy, width, depth, batch, steps,
                                                  folder / f"{strategy}-{round_index}"))
            except ddp_lib.RankFailed as error:
                if strategy not in FSDP2:
                    raise
                why = error.rank is not None and messages.last_error(error.result, error.rank)
                failed[strategy] = (why or str(error)).strip().splitlines()[0]
                del found[strategy]
    parameters = depth * (width * width + width)
    threads = course_helpers.threads_per_process(2)  # what the script's ranks take on this machine
    notes = [
        f"MLP of {depth} layers {width} x {width} ({parameters / 1e6:.1f} M parameters, fp32, "
        f"AdamW), batch {batch} per process, {steps} steps per launch of which "
        f"{steps - 5} timed; 2 processes, {threads} thread(s) each, Gloo; {rounds} interleaved "
        "round(s), one launch per strategy and round; bytes and step time of the rank that "
        "holds the most or is slower",
        "stored: weights + gradients + AdamW state kept between steps; after forward: the "
        "weights a rank holds from forward to backward (activations not counted)",
        "CPU step times are not what FSDP costs with NCCL: asked for a reduce-scatter, Gloo runs "
        "an all-reduce of the whole tensor and keeps its rank's part (pytorch/pytorch#118911), "
        "so FSDP's gradient reduction sends twice the bytes of a real reduce-scatter; no GPU "
        "figure is claimed",
    ]
    return Table(
        title=f"FSDP2 against DDP, lesson 11's zero_ladder.py, 2 CPU processes, "
              f"{parameters / 1e6:.1f} M parameters (MiB per rank; step time, median and range "
              "over interleaved rounds)",
        headers=["strategy", "stored MiB (weights + grads + AdamW)", "x DDP",
                 "MiB after forward", "x DDP", "step ms", "x DDP (per round)"],
        rows=rows_of(found, failed), notes=notes,
        data={"width": width, "depth": depth, "batch": batch, "steps": steps, "launches": found,
              "failed": failed})
