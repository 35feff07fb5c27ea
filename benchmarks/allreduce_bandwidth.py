"""All-reduce bandwidth: ``dist.all_reduce``, lesson 03's ring, and the gather-to-root scheme.

For float32 tensors from 1 KB to 64 MB on 2 and 4 processes (Gloo on the CPU, NCCL where every
process has a GPU is not measured here: the lesson's ring is a CPU/Gloo lesson). The ring is the
function of lesson 03's ``%%write_script ring_allreduce.py`` cell, written from the notebook at
run time, so the figures are those of the code the lesson teaches.

Bandwidths follow nccl-tests: ``algbw = bytes / time`` and ``busbw = algbw * 2 (N-1) / N``, the
rate every link of a ring must sustain, comparable across N. A one-process memory copy of the
same size is the reference: loopback TCP moves bytes through memory too.
"""

from __future__ import annotations

import ddp_lib
from benchmarks.common import ROOT, Table, build_dir, median, worker
from ddp_lib import scripts

SIZES = [1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [1 << 10, 1 << 20, 16 << 20, 64 << 20]
METHODS = ("all_reduce", "ring", "root")
GOAL = 0.9  # ring busbw / all_reduce busbw at >= 16 MB on 2 processes


def lesson_ring(directory) -> None:
    """Write lesson 03's ring_allreduce.py into ``directory``, from the notebook's cell."""
    scripts.from_notebook(ROOT / "notebooks" / "03_ring_allreduce.ipynb", "ring_allreduce.py",
                          directory=directory, quiet=True)


def measure(nprocs: int, sizes: list[int], repeats: int, folder) -> dict:
    """Seconds per (method, size) and round: the slowest rank of each round decides."""
    result = ddp_lib.launch(
        worker("allreduce_bandwidth.py"), nproc_per_node=nprocs, backend="gloo",
        args=[folder, ",".join(map(str, sizes)), repeats], run_dir=folder / f"run-{nprocs}",
        stream=False, timeout=900)
    times = {}
    for name in METHODS:
        for size in sizes:
            per_rank = [[v for s, v in result.metric(name, r) if s == size]
                        for r in range(nprocs)]
            times[(name, size)] = [max(vs) for vs in zip(*per_rank, strict=True)]
    for size in sizes:
        times[("memcpy", size)] = [v for s, v in result.metric("memcpy", 0) if s == size]
    return times


def busbw(size: int, seconds: float, nprocs: int) -> float:
    """GB/s each link carries in a ring all-reduce of ``size`` bytes done in ``seconds``."""
    return size / seconds * 2 * (nprocs - 1) / nprocs / 1e9


def human(size: int) -> str:
    return f"{size >> 20} MB" if size >= 1 << 20 else f"{size >> 10} KB"


def run(quick: bool = False) -> Table:
    sizes = QUICK_SIZES if quick else SIZES
    repeats = 5 if quick else 7
    folder = build_dir("allreduce")
    lesson_ring(folder)
    rows, notes, data = [], [], {}
    for nprocs in (2, 4):
        times = measure(nprocs, sizes, repeats, folder)
        data[nprocs] = {f"{k[0]} {k[1]}": v for k, v in times.items()}
        for size in sizes:
            lib = times[("all_reduce", size)]
            lib_s, copy_s = median(lib), median(times[("memcpy", size)])
            # ratios of busbw = inverse ratios of times, taken round by round
            ring_x = median([a / b for a, b in zip(lib, times[("ring", size)], strict=True)])
            root_x = median([a / b for a, b in zip(lib, times[("root", size)], strict=True)])
            rows.append([
                str(nprocs), human(size), f"{size / lib_s / 1e9:.3g}",
                f"{busbw(size, lib_s, nprocs):.3g}",
                f"{busbw(size, median(times[('ring', size)]), nprocs):.3g}", f"{ring_x:.2f}",
                f"{busbw(size, median(times[('root', size)]), nprocs):.3g}", f"{root_x:.2f}",
                f"{size / copy_s / 1e9:.2f}",
                f"{busbw(size, lib_s, nprocs) / (size / copy_s / 1e9):.2f}",
            ])
            if nprocs == 2 and size >= 16 << 20:
                verdict = "meets" if ring_x >= GOAL else "MISSES"
                notes.append(f"2 processes, {human(size)}: ring busbw = {ring_x:.2f} x "
                             f"dist.all_reduce ({verdict} the goal >= {GOAL})")
    return Table(
        title=f"All-reduce bandwidth, Gloo on the CPU (median of {repeats} interleaved rounds)",
        headers=["N", "size", "all_reduce algbw GB/s", "all_reduce busbw GB/s", "ring busbw GB/s",
                 "ring / all_reduce", "root busbw GB/s", "root / all_reduce", "memcpy GB/s",
                 "all_reduce busbw / memcpy"],
        rows=rows, notes=notes, data=data)
