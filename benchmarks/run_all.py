"""Run the benchmarks and print one markdown table each: ``python -m benchmarks.run_all``.

    python -m benchmarks.run_all                      # launch, allreduce, training, fsdp, gpu
    python -m benchmarks.run_all --quick              # fewer repetitions and sizes (a few minutes)
    python -m benchmarks.run_all --only allreduce training
    python -m benchmarks.run_all --only notebooks     # time every notebook headless

The machine's description and every table are also written to build/bench/results.md and
results.json (raw numbers included).
"""

from __future__ import annotations

import argparse
import importlib
import json
import time

from benchmarks.common import BUILD, command_line, machine
from ddp_lib.files import atomic_write_text

BENCHMARKS = {
    "launch": "benchmarks.launch_overhead",
    "allreduce": "benchmarks.allreduce_bandwidth",
    "training": "benchmarks.training_throughput",
    "fsdp": "benchmarks.fsdp_memory",
    "notebooks": "benchmarks.notebook_times",
    "gpu": "benchmarks.gpu_training",
}
DEFAULT = ["launch", "allreduce", "training", "fsdp", "gpu"]  # gpu: skipped without a CUDA GPU


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), default=DEFAULT,
                        help=f"which benchmarks (default: {' '.join(DEFAULT)})")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and sizes")
    args = parser.parse_args(argv)

    description = machine()
    header = ["## Machine", ""] + [f"- {k}: {v}" for k, v in description.items()]
    header += ["", f"Command: `{command_line()}`", ""]
    print("\n".join(header), flush=True)
    sections, raw = [], {"machine": description, "command": command_line()}
    for name in args.only:
        start = time.perf_counter()
        table = importlib.import_module(BENCHMARKS[name]).run(quick=args.quick)
        text = table.markdown() + f"\n({name}: {time.perf_counter() - start:.0f} s)\n"
        print(text, flush=True)
        sections.append(text)
        raw[name] = {"title": table.title, "headers": table.headers, "rows": table.rows,
                     "notes": table.notes, "data": table.data}
    BUILD.mkdir(parents=True, exist_ok=True)
    atomic_write_text(BUILD / "results.md", "\n".join(header + sections))
    atomic_write_text(BUILD / "results.json", json.dumps(raw, indent=1, default=str))
    print(f"Results: {BUILD / 'results.md'} and results.json")


if __name__ == "__main__":
    main()
