"""Training throughput and DDP scaling on the CPU: lesson 08's ``train_scaling.py`` as written.

The script is written from lesson 08's ``%%write_script train_scaling.py`` cell at run time
(``ddp_lib.scripts.from_notebook``), so the figures are those of the code learners run. Each
variant is one launch of it with 1 thread per process and the same batch per process; the
launches are interleaved in rounds (A B C D A B C D ...), so a load change on a shared machine
hits every variant alike:

* ``1 process``: the per-process baseline;
* ``1 process x N threads``: one process using N cores on N times the batch (lesson 05's
  other question: threads against processes);
* ``N processes``: DDP as lesson 08 runs it (DDP's default buckets, a 1 MiB first bucket and
  then 25 MiB, and its built-in fp32 all-reduce);
* ``N processes, fp16`` / ``bf16``: the same with ``--comm-hook fp16`` / ``bf16``.

The script reports images/s per epoch (the whole data set over the epoch's wall time). Epoch 0
is the warm-up (allocations, DDP's bucket rebuild) and is left out; a launch's figure is the
median of the later epochs. Scaling efficiency = images/s / (N x images/s of ``1 process``),
per round, then the median over rounds.
"""

from __future__ import annotations

import ddp_lib
from benchmarks.common import ROOT, Table, build_dir, median
from ddp_lib import scripts

GOAL = 0.85  # ResNet-18 DDP on 2 CPU ranks, as a fraction of ideal


def variants(nprocs: int) -> dict[str, tuple[int, int, list[str]]]:
    """name -> (processes, threads per process, extra flags of train_scaling.py)."""
    return {
        "1 process": (1, 1, []),
        f"1 process x {nprocs} threads": (1, nprocs, []),
        f"{nprocs} processes": (nprocs, 1, []),
        f"{nprocs} processes, fp16 hook": (nprocs, 1, ["--comm-hook", "fp16"]),
        f"{nprocs} processes, bf16 hook": (nprocs, 1, ["--comm-hook", "bf16"]),
    }


def one_launch(script, model: str, batch: int, steps: int, epochs: int, nproc: int,
               threads: int, flags: list[str], folder) -> float:
    """Median images/s of the epochs after the first, from one launch of the lesson's script."""
    per_process = batch * threads  # a process of T threads takes T times the batch
    args = ["--model", model, "--epochs", epochs, "--batch-size", per_process,
            "--threads", threads, "--train-samples", nproc * per_process * steps,
            "--test-samples", 64, "--checkpoint", folder / "checkpoint.pt", *flags]
    result = ddp_lib.launch(script, nproc_per_node=nproc, backend="gloo", args=args,
                            run_dir=folder / "run", stream=False, timeout=1200)
    epochs_seen = [m["value"] for m in result.records("images_per_s", rank=0)]
    assert len(epochs_seen) == epochs, epochs_seen
    return median(epochs_seen[1:])


def run(quick: bool = False, nprocs: int = 2) -> Table:
    folder = build_dir("training")
    script = scripts.from_notebook(ROOT / "notebooks" / "08_scaling.ipynb", "train_scaling.py",
                                   directory=folder, quiet=True)
    # model -> (batch per process and thread, steps per epoch, epochs incl. the warm-up one)
    # (an epoch of the small CNN must last long enough to time; the data set has 10,000 images)
    plans = {"small": (64, 40 if quick else 60, 3), "resnet18": (32, 2, 3 if quick else 4)}
    rounds = 2 if quick else 4
    rows, notes, data = [], [], {}
    for model, (batch, steps, epochs) in plans.items():
        found: dict[str, list[float]] = {name: [] for name in variants(nprocs)}
        for round_index in range(rounds):
            for name, (nproc, threads, flags) in variants(nprocs).items():
                found[name].append(one_launch(
                    script, model, batch, steps, epochs, nproc, threads, flags,
                    folder / model / f"{name.replace(' ', '_').replace(',', '')}-{round_index}"))
        data[model] = found
        solo = found["1 process"]
        efficiency = {}
        for name, values in found.items():
            workers = variants(nprocs)[name][0] * variants(nprocs)[name][1]
            efficiency[name] = [v / (workers * s) for v, s in zip(values, solo, strict=True)]
            rows.append([model, name, f"{median(values):.1f}",
                         f"{min(values):.1f}–{max(values):.1f}",
                         f"{median(efficiency[name]):.2f}",
                         f"{min(efficiency[name]):.2f}–{max(efficiency[name]):.2f}"])
        if model == "resnet18":
            plain = median(efficiency[f"{nprocs} processes"])
            verdict = "meets" if plain >= GOAL else "MISSES"
            notes.append(f"ResNet-18, {nprocs} processes: {plain:.2f} x ideal, median of "
                         f"{rounds} rounds ({verdict} the goal >= {GOAL})")
    notes.append(f"batch per process and thread: small {plans['small'][0]}, resnet18 "
                 f"{plans['resnet18'][0]}; {rounds} interleaved rounds, one launch per variant "
                 "and round; epoch 0 of each launch left out")
    return Table(
        title=f"Training throughput, lesson 08's train_scaling.py, 1 and {nprocs} CPU processes "
              "(median and range over interleaved rounds)",
        headers=["model", "variant", "images/s", "range", "x ideal (N x 1 process)", "range"],
        rows=rows, notes=notes, data=data)
