"""Wall time of every notebook of the series, executed headless as ``make run`` executes them.

Each notebook runs in a fresh kernel (``jupyter nbconvert --execute``, the kernel's start
included), one after the other; the executed copies go to build/bench/notebooks/. On CPUs at the
small size on the generated data set, with the goal of each notebook well under 90 s on 2 cores
and the whole series under 6 minutes; where a GPU is visible, at full size, as a learner there
runs them (no goal: the figures go to workshop/gpu_seconds.json, which the schedule reads).
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.common import ROOT, Table, bench_env, build_dir, run_command

NOTEBOOK_GOAL_S = 90.0
SERIES_GOAL_S = 360.0


def run(quick: bool = False) -> Table:
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if quick:
        notebooks = notebooks[:1]
    output = build_dir("notebooks")
    import torch

    gpu = torch.cuda.is_available()
    env = bench_env(DDP_WORKSHOP_DATASET="synthetic", DDP_WORKSHOP_FULL_SIZE="1" if gpu else "0")
    env.pop("OMP_NUM_THREADS")  # as in `make run`: the notebooks choose their threads
    jupyter = Path(sys.executable).with_name("jupyter")
    rows, seconds = [], {}
    failed = []
    for notebook in notebooks:
        command = [str(jupyter), "nbconvert", "--to", "notebook", "--execute",
                   "--ExecutePreprocessor.timeout=1800", "--output-dir", str(output),
                   str(notebook)]
        try:
            seconds[notebook.name] = run_command(command, env=env).wall
        except RuntimeError as exc:  # a notebook being written may fail: time the others
            failed.append(notebook.name)
            said = [line for line in str(exc).splitlines() if line.strip()] or ["no message"]
            rows.append([notebook.name, "", f"FAILED: {said[-1][:80]}"])
            continue
        verdict = "ok" if seconds[notebook.name] < NOTEBOOK_GOAL_S else "OVER"
        rows.append([notebook.name, f"{seconds[notebook.name]:.1f}", verdict])
    total = sum(seconds.values())
    rows.append([f"all ({len(seconds)} run)", f"{total:.1f}",
                 "ok" if total < SERIES_GOAL_S and not failed else "OVER" if not failed
                 else f"incomplete: {', '.join(failed)} failed"])
    return Table(
        title=(f"Notebooks executed headless, full size on {torch.cuda.get_device_name(0)}"
               if gpu else "Notebooks executed headless, small size, synthetic data")
        + " (one run each)",
        headers=["notebook", "wall s", f"goal < {NOTEBOOK_GOAL_S:.0f} s each, "
                 f"< {SERIES_GOAL_S:.0f} s all"],
        rows=rows, data={"seconds": seconds})
