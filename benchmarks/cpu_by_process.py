"""Where a command's CPU time goes, by kind of process: ``python -m benchmarks.cpu_by_process``.

    python -m benchmarks.cpu_by_process -- python -m pytest tests -n 2

Runs the command and, once a second until it ends, reads the CPU time (user + system) of every
process started since; then prints a table by kind: torchrun agents, workers by script, Jupyter
kernels, the browser, pytest. A process that starts and ends between two readings is missed, so
the total is a lower bound; and every process counts, the command's or not, so measure on an
otherwise idle machine. That is how the suite's time was traced to worker start-up (``import
torchvision`` imports ``torch._dynamo``) and to lesson 07's bf16 runs on a CPU without bf16
instructions.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import time
from pathlib import Path

import psutil


def kind(cmdline: list[str], environ: dict[str, str]) -> str:
    """A process's kind, from its command line and whether torchrun started it."""
    text = " ".join(cmdline)
    if "LOCAL_RANK" in environ:
        script = next((Path(part).name for part in cmdline if part.endswith(".py")), "?")
        return f"worker {script}"
    if "torch.distributed.run" in text or "torchrun" in text:  # ddp_lib.launching.torchrun_main too
        return "torchrun agent"
    if "ipykernel" in text:
        return "Jupyter kernel"
    if "chrom" in text:
        return "browser"
    if "jupyter" in text:
        return "Jupyter server"
    if "pytest" in text or "execnet" in text or "xdist" in text:
        return "pytest"
    return "other"


def sample(command: list[str], interval: float = 1.0) -> tuple[dict[str, list[float]], float]:
    """Run ``command``; return CPU seconds per process, by kind, and the wall time."""
    seen: dict[tuple[int, float], list] = {}  # (pid, start time) -> [kind, CPU seconds]
    start, started_at = time.perf_counter(), time.time() - 1  # create_time has coarse ticks
    child = subprocess.Popen(command)
    while True:
        for process in psutil.process_iter(["pid", "create_time", "cmdline", "cpu_times"]):
            info = process.info
            if (info["cpu_times"] is None or info["create_time"] < started_at
                    or info["pid"] == psutil.Process().pid):
                continue
            key = (info["pid"], info["create_time"])
            if key not in seen:
                try:
                    environ = process.environ()
                except psutil.Error:
                    environ = {}
                seen[key] = [kind(info["cmdline"] or [], environ), 0.0]
            seen[key][1] = max(seen[key][1], info["cpu_times"].user + info["cpu_times"].system)
        if child.poll() is not None:
            break
        time.sleep(interval)
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for name, seconds in seen.values():
        if seconds > 0:
            by_kind[name].append(seconds)
    return by_kind, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    command = [part for part in parser.parse_args().command if part != "--"]
    if not command:
        parser.error("give the command to measure after --")
    by_kind, wall = sample(command)
    total = sum(sum(v) for v in by_kind.values())
    print(f"\n{wall / 60:.1f} min wall, {total / 60:.1f} CPU-min seen\n")
    print("| kind | processes | CPU s | CPU s each | share |\n|---|---|---|---|---|")
    for name, values in sorted(by_kind.items(), key=lambda item: -sum(item[1])):
        print(f"| {name} | {len(values)} | {sum(values):.0f} | {sum(values) / len(values):.1f} "
              f"| {sum(values) / total:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
