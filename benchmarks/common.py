"""What every benchmark shares: the machine's description, repetitions, tables, a build folder."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "bench"


@dataclass
class Table:
    """One benchmark's result: a markdown table, the ratios it is about, and the raw numbers."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def markdown(self) -> str:
        lines = [f"### {self.title}", "",
                 "| " + " | ".join(self.headers) + " |",
                 "|" + "|".join("---" for _ in self.headers) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        if self.notes:
            lines += [""] + [f"- {note}" for note in self.notes]
        return "\n".join(lines) + "\n"


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def interleaved(variants: Mapping, repeats: int) -> dict:
    """Run every variant once per round, ``repeats`` rounds (A B C A B C ...).

    On a shared machine the load drifts; interleaving spreads the drift over all variants, and
    the ratios between variants of one round stay meaningful. Returns each variant's values.
    """
    values: dict[str, list] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, measure in variants.items():
            values[name].append(measure())
    return values


@dataclass(frozen=True)
class Cost:
    """Wall seconds, and CPU seconds of this process and of the children it waited for.

    On a shared machine the wall time depends on the neighbours' load; the CPU time much less,
    so it is the better witness of work added or removed.
    """

    wall: float
    cpu: float


@contextlib.contextmanager
def measured(into: list[Cost]):
    """Append the :class:`Cost` of the ``with`` block to ``into``."""
    before = _cpu_seconds()
    start = time.perf_counter()
    yield
    into.append(Cost(time.perf_counter() - start, _cpu_seconds() - before))


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # waited-for descendants included
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_command(command: Sequence[str], *, env: Mapping[str, str] | None = None) -> Cost:
    """Run a command to its end, its output discarded; raise if it fails."""
    costs: list[Cost] = []
    with measured(costs):
        done = subprocess.run(list(command), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, env=dict(env) if env is not None else None)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed ({done.returncode}):\n"
                           + done.stderr.decode(errors="replace")[-2000:])
    return costs[0]


def bench_env(**extra: str) -> dict[str, str]:
    """The environment of benchmark subprocesses: ddp_lib importable, one thread unless told."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def build_dir(name: str) -> Path:
    """A folder under build/bench/ for one benchmark's written scripts and runs."""
    path = BUILD / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def worker(name: str) -> Path:
    """A script of benchmarks/workers/, run by torchrun."""
    return Path(__file__).resolve().parent / "workers" / name


def machine() -> dict[str, str]:
    """CPU, GPU, driver and library versions: what a reader needs to compare figures."""
    import torch

    from ddp_lib import hardware

    hw = hardware.detect()
    info = {
        "cpu": f"{hw.cpu_model}, {hw.cpu_cores} usable cores ({os.cpu_count()} online)",
        "gpu": ", ".join(hw.gpu_names) if hw.gpu_names else "none visible",
        "torch": torch.__version__ + (f" (built with CUDA {hw.cuda_version})" if hw.cuda_version
                                      else ""),
        "python": platform.python_version(),
        "os": platform.platform(),
        "load average (1, 5, 15 min)": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    if hw.cuda_gpus:
        info["driver"] = _nvidia_driver()
    return info


def _nvidia_driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown (nvidia-smi not usable)"


def command_line() -> str:
    """How this run was started, to paste into the results."""
    return " ".join([Path(sys.executable).name, "-m", "benchmarks.run_all", *sys.argv[1:]])
