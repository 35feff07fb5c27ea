"""Write docs/schedule.md, the instructor's plan, from the notebooks' own metadata.

Each notebook's ``metadata["ddp_workshop"]`` holds its teaching and exercise minutes (the single
source: the "*Teaching: N min · Exercises: M min*" line of its first cell is checked against it)
and whether some of its cells do their work only on a GPU. The run times are measured figures,
kept here with where each comes from, because a schedule is only as good as its sources.

``python -m workshop.schedule`` rewrites docs/schedule.md; ``--check`` fails if it is stale.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
OUTPUT = ROOT / "docs" / "schedule.md"
KEY = "ddp_workshop"
MINUTES_LINE = re.compile(r"\*Teaching: (\d+) min · Exercises: (\d+) min\*")

# Where the figures come from: a key in the table, its meaning under it.
SOURCES = {
    "alone": "the notebook executed alone, headless, kernel start included (`make bench "
             "BENCH_ARGS=\"--only notebooks\"`, small size, every solution run) on 2026-11-24, "
             "commit 6303671, on an otherwise idle 2-core AMD EPYC machine "
             "([benchmarks §4](benchmarks.md#4-the-series-itself)); a machine with more cores "
             "runs it faster.",
    "alone, 2026-11-25": "the notebook executed alone, headless (`jupyter nbconvert --execute`, "
                         "kernel start included, small size, every solution run) on 2026-11-25, "
                         "commit fba81d0, on a 2-core machine of the same kind, not otherwise "
                         "busy (load average under 1.5).",
    "alone, 2026-11-26": "the same, on 2026-11-26, commit e6f834f, load average under 1.7.",
    "h100": "[benchmarks, GPU](benchmarks.md#gpu): one H100, full size, taken before the GPU "
            "path was rebuilt and the lesson changed: **not measured since**.",
    "h200": "[benchmarks, GPU](benchmarks.md#gpu): one H200 (16 cores, the node's torch "
            "2.11.0+cu130), full size, headless (the GPU guide's `run_notebooks.py`), at commit "
            "7d7b501, 2026-11-26.",
}
CPU_NOW, GPU_OLD, GPU_NOW = "alone", "h100", "h200"
# Seconds per notebook, and the source of each figure (None: no record).
CPU_SECONDS: dict[str, tuple[float, str]] = {
    "00": (45.6, CPU_NOW), "01": (46.9, CPU_NOW), "02": (13.4, CPU_NOW),
    "03": (35.2, CPU_NOW), "04": (70.8, CPU_NOW), "05": (123.4, CPU_NOW),
    "06": (95.8, CPU_NOW), "07": (91.6, CPU_NOW), "08": (180.2, CPU_NOW),
    "09": (101.1, CPU_NOW), "10": (21.1, "alone, 2026-11-25"),
    "11": (75.8, "alone, 2026-11-26"),
}
GPU_SECONDS: dict[str, tuple[float, str] | None] = {
    "00": (52, GPU_OLD), "01": (66, GPU_OLD), "02": (16, GPU_NOW), "03": (37, GPU_OLD),
    "04": (90, GPU_OLD), "05": (173, GPU_NOW), "06": (140, GPU_NOW), "07": (69, GPU_OLD),
    "08": (184, GPU_OLD), "09": (139, GPU_NOW), "10": None, "11": None,
}

# Per lesson: the questions learners ask, and the failure it most often meets on a real cluster.
NOTES: dict[str, tuple[str, str]] = {
    "00": ("Why Gloo on a laptop and NCCL on GPUs? Why does `OMP_NUM_THREADS=1` appear? "
           "What is the difference between `RANK` and `LOCAL_RANK`?",
           "Processes oversubscribing the cores (each one using every core), or a login node "
           "without GPUs: run on a compute node, and check `nvidia-smi` inside the job."),
    "01": ("Should I use `num_workers`? Why prepare tensors once instead of a PIL pipeline? "
           "Why rename the checkpoint instead of writing it in place?",
           "Data on a slow shared file system: the GPU waits for the loader. Time the epoch in "
           "two parts first; copy the data set to the node's local disk."),
    "02": ("Is DataParallel deprecated? Why is `cuda:0` busier than the others? Why the "
           "`module.` prefix in saved weights?",
           "A checkpoint saved from the wrapped model that a plain model refuses to load "
           "(`Unexpected key(s)`): save `model.module.state_dict()`."),
    "03": ("Does NCCL really use a ring? (NCCL chooses rings, trees and more by size, rank "
           "count and topology; Gloo always runs its ring.) Why does DDP divide the gradients "
           "before the all-reduce? (A float16 sum can overflow where the average does not.)",
           "A slow link between two nodes sets the speed of the whole ring: one bad network "
           "card or a wrong interface makes every all-reduce slow."),
    "04": ("`env://`, `tcp://` or `file://`: which should I use? (torchrun's `env://`.) Why "
           "does the world size have to be known in advance?",
           "A port already in use or blocked by a firewall (`EADDRINUSE`, or a rendezvous that "
           "waits until its timeout); a stale `file://` left by a previous run."),
    "05": ("Is my batch size per process or global? (Per process.) Why does only rank 0 save? "
           "Do I need `set_epoch`?",
           "A job that runs but trains every rank on the same data (no `DistributedSampler`), "
           "or that hangs at the end because one rank left early: keep `barrier()` before "
           "`destroy_process_group()`."),
    "06": ("What does `--rdzv-id` do? Why one Slurm task per node? Does my script change "
           "for several nodes? (No.)",
           "Nodes that cannot reach each other on the chosen interface: set "
           "`NCCL_SOCKET_IFNAME`/`GLOO_SOCKET_IFNAME`, open the rendezvous port, and look "
           "with `NCCL_DEBUG=INFO`."),
    "07": ("fp16 or bf16? Why does AMP not speed up my small model? Does DDP send 16-bit "
           "gradients? (No: fp32, unless a compression hook.)",
           "An old GPU without fast bf16, or a loss that becomes NaN in fp16 without a "
           "`GradScaler`; and comparing with TF32 'fp32' without saying so."),
    "08": ("How should the learning rate scale with more GPUs? Why does my speed-up stop "
           "growing? When do compression hooks pay?",
           "Scaling measured with a fixed global batch that shrinks per GPU, or across nodes "
           "on a slow network: profile one step before buying more nodes."),
    "09": ("How do I see where each rank is? Why does nothing print an error? What timeout "
           "should I set?",
           "A collective inside `if rank == 0:` or uneven data on one rank: the job sits "
           "silent until the scheduler kills it. Set a process-group timeout and take every "
           "rank's stack (`py-spy dump`)."),
    "10": ("Which variable holds my rank under mpiexec or srun? Does my script change for "
           "PBS? Where did Horovod's DistributedOptimizer and broadcast go in DDP?",
           "Every process of a machine taking the same rank: a script that reads `PMI_RANK` "
           "under `mpiexec --ppn 1 torchrun`, or `SLURM_PROCID` under `mpiexec` in a Slurm "
           "job. Read torchrun's variables first and Slurm's last, and stop on a launcher's "
           "variables in part (`mpiexec -pmi-port`); since MPICH's mpiexec leaves the others "
           "waiting when a rank exits (Open MPI's ends the job), set a process-group timeout."),
    "11": ("Why not FSDP everywhere? (It sends more than DDP: each layer's weights, forward and "
           "backward.) Why build the optimizer after fully_shard? Can a checkpoint from 8 GPUs "
           "resume on 4? (DCP: yes.)",
           "A rank that runs one forward more than the others (uneven evaluation shards) hangs "
           "in FSDP's all-gather; and a checkpoint written with torch.save from rank 0 holds one "
           "shard only: use DCP, or get_model_state_dict with full_state_dict=True."),
}


@dataclass(frozen=True)
class Lesson:
    """One notebook as the schedule sees it."""

    number: str
    title: str
    teaching_min: int
    exercises_min: int
    gpu_only_cells: bool

    @property
    def minutes(self) -> int:
        return self.teaching_min + self.exercises_min


def lessons(folder: Path = NOTEBOOKS) -> list[Lesson]:
    """Every lesson, from its metadata; the first cell's minutes line must agree with it."""
    found = []
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        meta = notebook.metadata[KEY]
        first = notebook.cells[0].source
        shown = MINUTES_LINE.search(first)
        minutes = (meta["teaching_min"], meta["exercises_min"])
        if not shown or (int(shown[1]), int(shown[2])) != minutes:
            raise ValueError(f"{path.name}: the first cell's minutes line disagrees with "
                             f"metadata[{KEY!r}] = {meta}")
        title = first.splitlines()[0].removeprefix("# ").split(" · ", 1)[-1]
        found.append(Lesson(path.name[:2], title, meta["teaching_min"], meta["exercises_min"],
                            bool(meta["gpu_only_cells"])))
    return found


def sessions(day: list[Lesson], cap: int) -> list[list[Lesson]]:
    """Whole lessons packed in order into sessions of at most ``cap`` minutes (or one lesson)."""
    packed: list[list[Lesson]] = []
    for lesson in day:
        if packed and sum(x.minutes for x in packed[-1]) + lesson.minutes <= cap:
            packed[-1].append(lesson)
        else:
            packed.append([lesson])
    return packed


def clock(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def day_table(day: list[Lesson], cap: int, start: int = 9 * 60) -> list[str]:
    """A day's timetable: sessions, a 15-minute break between them, lunch after the second."""
    rows = ["| time | what |", "|---|---|"]
    now = start
    packed = sessions(day, cap)
    for i, session in enumerate(packed):
        for lesson in session:
            rows.append(f"| {clock(now)}–{clock(now + lesson.minutes)} | {lesson.number} "
                        f"{lesson.title} ({lesson.teaching_min} + {lesson.exercises_min} min) |")
            now += lesson.minutes
        if i < len(packed) - 1:
            pause = 60 if i == 1 else 15
            rows.append(f"| {clock(now)}–{clock(now + pause)} | "
                        f"{'lunch' if pause == 60 else 'break'} |")
            now += pause
    rows.append(f"| {clock(now)} | end |")
    return rows


def split_in_two(all_lessons: list[Lesson]) -> tuple[list[Lesson], list[Lesson]]:
    """The split into two days whose longer day is shortest."""
    best = min(range(1, len(all_lessons)),
               key=lambda k: max(sum(x.minutes for x in all_lessons[:k]),
                                 sum(x.minutes for x in all_lessons[k:])))
    return all_lessons[:best], all_lessons[best:]


def seconds(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.0f} s"


def render(all_lessons: list[Lesson]) -> str:
    """The whole of docs/schedule.md."""
    total = sum(x.minutes for x in all_lessons)
    first, second = split_in_two(all_lessons)
    out = [
        "# Workshop schedule",
        "",
        "Generated by `make schedule` (`python -m workshop.schedule`) from each notebook's "
        f"`metadata[\"{KEY}\"]`; do not edit by hand. Minutes are teaching + exercises, as in "
        "each lesson's first cell.",
        "",
        f"The whole series: {total} minutes ({total / 60:.1f} hours) of teaching and exercises.",
        "",
        "## One day",
        "",
        "Long: every lesson at its stated length. Where the day is shorter, teach 02 and 03 "
        "briefly (their key points) and leave 08's exercises as homework.",
        "",
        *day_table(all_lessons, cap=110),
        "",
        "## Two days",
        "",
        "### Day 1",
        "",
        *day_table(first, cap=95),
        "",
        "### Day 2",
        "",
        *day_table(second, cap=95),
        "",
        "## Run time per lesson",
        "",
        "How long the notebook takes to execute, top to bottom, at the course's size: the "
        "small size on CPU, the full size where a GPU is. Run each notebook once before the "
        "workshop on the machines learners will use: the first run also prepares the data.",
        "",
        "| lesson | GPU-only cells | CPU | source | GPU | source |",
        "|---|---|---|---|---|---|",
    ]
    for lesson in all_lessons:
        cpu, cpu_source = CPU_SECONDS[lesson.number]
        gpu, gpu_source = GPU_SECONDS[lesson.number] or (None, "–")
        out.append(f"| {lesson.number} | {'yes' if lesson.gpu_only_cells else 'no'} | "
                   f"{seconds(cpu)} | {cpu_source} | {seconds(gpu)} | {gpu_source} |")
    out += [""] + [f"- `{key}`: {meaning}" for key, meaning in SOURCES.items()]
    out += ["", "A lesson with GPU-only cells runs everywhere; those cells print what a GPU "
            "would show instead of doing it.", "", "## Instructor notes", ""]
    for lesson in all_lessons:
        questions, failure = NOTES[lesson.number]
        out += [f"### {lesson.number} {lesson.title}", "",
                f"- **Common questions**: {questions}",
                f"- **On a real cluster**: {failure}", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if docs/schedule.md is stale")
    args = parser.parse_args(argv)
    text = render(lessons())
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{OUTPUT} is out of date: run make schedule", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
