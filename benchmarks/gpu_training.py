"""On one GPU: lesson 07's AMP comparison with its own script, and DDP's cost with one process.

* AMP: lesson 07's ``train_amp_speed.py`` (its second step), written from the notebook's
  ``%%write_script`` cell at run time, with ``--epochs 0 --measure-steps`` (images/s of training
  steps after a warm-up, per round, and CUDA peak memory), ResNet-18 at batch 1024, the lesson's
  variants: fp32, fp32 channels_last, fp16, fp16 channels_last, bf16 channels_last. One launch
  per variant, the launches interleaved in rounds.
* DDP with one process against the plain model: the lessons have no script that trains the
  plain model, so ``workers/gpu_throughput.py`` measures it.

Skipped, with a printed reason and a row saying so, where no CUDA GPU is visible.
"""

from __future__ import annotations

import torch

import ddp_lib
from benchmarks.common import ROOT, Table, build_dir, median, worker
from ddp_lib import scripts

DDP_GOAL = 0.95  # DDP with one process, as a fraction of the plain model's images/s
AMP_VARIANTS = {
    "fp32": [],
    "fp32 channels_last": ["--channels-last"],
    "fp16": ["--precision", "fp16"],
    "fp16 channels_last": ["--precision", "fp16", "--channels-last"],
    "bf16 channels_last": ["--precision", "bf16", "--channels-last"],
}


def amp(quick: bool, folder) -> dict[str, dict[str, list[float]]]:
    """Per variant: images/s per round (median of the launch's rounds) and peak MB."""
    script = scripts.from_notebook(ROOT / "notebooks" / "07_mixed_precision.ipynb",
                                   "train_amp_speed.py", directory=folder, quiet=True)
    measure = ["--model", "resnet18", "--epochs", 0, "--batch-size", 1024, "--warmup-steps", 10,
               "--measure-steps", 10 if quick else 20, "--rounds", 3,
               "--train-samples", 1024, "--test-samples", 256]
    found = {name: {"images_per_s": [], "peak_mb": []} for name in AMP_VARIANTS}
    # Emulated bf16 (before Ampere) is not what a bf16 run means: time only the real thing.
    native_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    for round_index in range(1 if quick else 3):
        for name, flags in AMP_VARIANTS.items():
            if name.startswith("bf16") and not native_bf16:
                continue
            result = ddp_lib.launch(script, nproc_per_node=1, args=[*measure, *flags],
                                    run_dir=folder / f"{name.replace(' ', '_')}-{round_index}",
                                    stream=False, timeout=1200)
            rounds = [m["value"] for m in result.records("images_per_s", rank=0)]
            found[name]["images_per_s"].append(median(rounds))
            found[name]["peak_mb"] += [m["value"] for m in result.records("peak_memory_mb")]
    return {name: values for name, values in found.items() if values["images_per_s"]}


def ddp_overhead(quick: bool, folder) -> dict[str, list[float]]:
    args = ["--steps", 5 if quick else 20, "--rounds", 2 if quick else 3]
    result = ddp_lib.launch(worker("gpu_throughput.py"), nproc_per_node=1, args=args,
                            run_dir=folder / "ddp", stream=False, timeout=1200)
    found: dict[str, list[float]] = {}
    for record in result.records("images_per_s"):
        found.setdefault(record["variant"], []).append(record["value"])
    return found


def run(quick: bool = False) -> Table:
    headers = ["what", "variant", "images/s", "x baseline", "peak MB"]
    title = ("One GPU: lesson 07's train_amp_speed.py, ResNet-18 at batch 1024, by precision and "
             "layout; DDP with 1 process vs the plain model (workers/gpu_throughput.py, batch 256)")
    if not torch.cuda.is_available():
        print("gpu: skipped, no CUDA GPU is visible to this torch "
              f"({torch.__version__}, CUDA build {torch.version.cuda or 'none'})")
        return Table(title=title, headers=headers,
                     rows=[["skipped: no CUDA GPU visible", "", "", "", ""]])
    folder = build_dir("gpu")
    precision = amp(quick, folder / "amp")
    base = precision["fp32"]["images_per_s"]
    rows = [["AMP (x fp32)", name, f"{median(v['images_per_s']):.0f}",
             f"{median([a / b for a, b in zip(v['images_per_s'], base, strict=True)]):.2f}",
             f"{median(v['peak_mb']):.0f}" if v["peak_mb"] else ""]
            for name, v in precision.items()]
    ddp = ddp_overhead(quick, folder)
    plain = ddp["fp32"]
    rows += [["DDP (x plain model)", name, f"{median(values):.0f}",
              f"{median([v / b for v, b in zip(values, plain, strict=True)]):.2f}", ""]
             for name, values in ddp.items()]
    ratio = median([v / b for v, b in zip(ddp["ddp 1 process fp32"], plain, strict=True)])
    best = max(precision, key=lambda name: median(precision[name]["images_per_s"]))
    notes = [f"AMP: best {best}, {median(precision[best]['images_per_s']) / median(base):.2f} x "
             "fp32 (lesson 07 asserts >= 3 x on compute capability >= 9.0)",
             f"DDP with 1 process (gradient_as_bucket_view, static_graph): {ratio:.2f} x the "
             f"plain model ({'meets' if ratio >= DDP_GOAL else 'MISSES'} the goal >= {DDP_GOAL})"]
    return Table(title=title, headers=headers, rows=rows, notes=notes,
                 data={"amp": precision, "ddp": ddp})
