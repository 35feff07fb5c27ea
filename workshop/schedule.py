"""Write docs/schedule.md, the instructor's plan, from the notebooks' own metadata.

Each notebook's ``metadata["ddp_workshop"]`` holds its teaching and exercise minutes (the single
source: the "*Teaching: N min · Exercises: M min*" line of its first cell is checked against it)
and whether some of its cells do their work only on a GPU. The run times are measured figures,
kept here with where each comes from, because a schedule is only as good as its sources.

``python -m workshop.schedule`` rewrites docs/schedule.md; ``--check`` fails if it is stale.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from workshop import sections

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
OUTPUT = ROOT / "docs" / "schedule.md"
KEY = "ddp_workshop"
MINUTES_LINE = re.compile(r"\*Teaching: (\d+) min · Exercises: (\d+) min\*")

GPU_RUNS = json.loads((ROOT / "workshop" / "gpu_seconds.json").read_text(encoding="utf-8"))
# Where the figures come from: a key in the table, its meaning under it.
SOURCES = {
    "cells": "the sum of the notebook's code cells, run one notebook at a time under nbval "
             "(small size, every solution run, kernel start not included) on an otherwise idle "
             "2-core AMD EPYC machine: `workshop/run_seconds.json`, which says when, at which "
             "commit and with which command; the same figures set the sections' minutes.",
    **{device: f"{run['about']}; {run['date'] or 'date not recorded'}, at "
               f"{run['commit'] or 'a commit not recorded'} (`workshop/gpu_seconds.json`)."
       for device, run in GPU_RUNS.items()},
}
# Seconds per notebook, and the source of each figure (None: no record).
CPU_SECONDS: dict[str, tuple[float, str]] = {
    lesson: (sum(cells.values()), "cells") for lesson, cells in sections.run_seconds().items()}
GPU_SECONDS: dict[str, tuple[float, str] | None] = {lesson: None for lesson in CPU_SECONDS}
GPU_SECONDS |= {lesson: (seconds, device) for device, run in GPU_RUNS.items()
                for lesson, seconds in run["seconds"].items()}

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
    """One notebook as the schedule sees it: its sections, and its minutes from their metadata."""

    number: str
    title: str
    teaching_min: int
    exercises_min: int
    gpu_only_cells: bool
    sections: tuple[sections.Section, ...]

    @property
    def minutes(self) -> int:
        return self.teaching_min + self.exercises_min


def lessons(folder: Path = NOTEBOOKS) -> list[Lesson]:
    """Every lesson. Its minutes are its sections' (those taught, and the exercises that are
    not homework); the first cell's minutes line and the notebook's metadata must agree."""
    found = []
    measured = sections.run_seconds()
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        meta = notebook.metadata[KEY]
        parts = sections.read(path, measured)
        teaching = sum(s.minutes for s in parts if s.tier in sections.TAUGHT)
        exercises = sum(e.minutes for s in parts for e in s.exercises if e.tier != "homework")
        first = notebook.cells[0].source
        shown = MINUTES_LINE.search(first)
        stated = (meta["teaching_min"], meta["exercises_min"])
        if not shown or (int(shown[1]), int(shown[2])) != stated or stated != (teaching,
                                                                               exercises):
            raise ValueError(f"{path.name}: its sections add up to {teaching} min of teaching "
                             f"and {exercises} of exercises; the first cell's minutes line and "
                             f"metadata[{KEY!r}] = {meta} must say the same")
        title = first.splitlines()[0].removeprefix("# ").split(" · ", 1)[-1]
        found.append(Lesson(path.name[:2], title, teaching, exercises,
                            bool(meta["gpu_only_cells"]), tuple(parts)))
    return found


@dataclass(frozen=True)
class Track:
    """A way through the course for one audience: its lessons in order, over how many days.

    It teaches every core section of its lessons that is for its audience, and the optional and
    demo sections it names (``"08.2"``: lesson 08's section 2), with each taught section's core
    exercises (and its optional ones, where ``optional_exercises``)."""

    name: str
    title: str
    days: int
    audience: str | None  # None: every audience
    order: tuple[str, ...]  # lesson numbers
    adds: tuple[str, ...]  # optional and demo sections taught, "lesson.section"
    optional_exercises: bool
    about: str
    capstone: str  # done in the last wrap-up (docs/instructors.md, "Capstones")


def section_key(lesson: str, section: sections.Section) -> str | None:
    """"05.3" for lesson 05's "3. The main run"; None for an unnumbered one (Key points...)."""
    return f"{lesson}.{section.number}" if section.number else None


ALL = tuple(f"{n:02d}" for n in range(12))
TRACKS = (
    Track("ml", "Machine learning, one day", 1, "ML",
          ("00", "01", "02", "03", "04", "05", "07", "08", "11"),
          ("08.1", "08.2", "08.3"), False,
          "For people who train models on a laptop or on cloud GPUs: through DDP, mixed "
          "precision, scaling (lesson 08's script and its throughput for 1 … N processes) and "
          "FSDP2. Multi-node launch, the launchers and hangs are the HPC day's.",
          "lesson 05's script on the room's GPUs, 1 and N processes, its speed-up recorded "
          "(`python -m workshop.capstone speedup`)"),
    Track("hpc", "HPC centre, one day", 1, "HPC",
          ("00", "01", "04", "05", "06", "10", "09"), (), False,
          "For people who run jobs on a cluster: through multi-node launch, lesson 10's "
          "launchers and binding right after 06, then 09's hangs. DataParallel (02) and the "
          "ring all-reduce (03), which MPI users know, are homework; so are mixed precision, "
          "scaling and FSDP2, the machine-learning day's.",
          "the take-home kit's job submitted with `sbatch` or `qsub` on the host cluster, its "
          "log checked (`python -m workshop.capstone joblog FILE`)"),
    Track("two-day", "Two days", 2, None, ALL,
          ("05.5", "05.6", "06.5", "06.7", "07.4", "07.7", "08.1", "08.2", "08.3", "09.4",
           "10.5", "11.3", "11.5"), False,
          "Both days' core sections, and the optional sections and demos named in "
          "`workshop/schedule.py`; the optional sections of lessons 00 to 04 are homework, so "
          "that the conversion comes before lunch on day 1.",
          "the two tracks': the speed-up on the room's GPUs, and the take-home kit's job on the "
          "host cluster"),
)
# Lesson 05's exercise 1, the learner's own DDP conversion: in every track, before lunch on day 1.
DDP_IN_HAND = ("05", 1)
DAY_START, DAY_END = 9 * 60, 17 * 60
WELCOME_MIN, WRAP_UP_MIN = 15, 15
# The teaching blocks of a day, between the welcome, two breaks, lunch and the wrap-up.
BLOCKS = ((9 * 60 + 15, 10 * 60 + 30), (10 * 60 + 45, 12 * 60 + 30),
          (13 * 60 + 30, 15 * 60), (15 * 60 + 15, 16 * 60 + 45))
LUNCH = (12 * 60 + 30, 13 * 60 + 30)
TEACHING_MIN = sum(end - begin for begin, end in BLOCKS)  # a day's


@dataclass(frozen=True)
class Slot:
    lesson: Lesson
    section: sections.Section
    minutes: int
    exercises: tuple[sections.Exercise, ...]


def slots(track: Track, all_lessons: list[Lesson]) -> list[Slot]:
    """The track's sections in teaching order, each with the exercises done there, in the
    minutes a room of learners needs (``room_minutes``)."""
    by_number = {lesson.number: lesson for lesson in all_lessons}
    exercise_tiers = ("core", "optional") if track.optional_exercises else ("core",)
    chosen = []
    for number in track.order:
        lesson = by_number[number]
        for section in lesson.sections:
            if section.tier == "core":
                if track.audience and track.audience not in section.audiences:
                    continue
            elif section_key(number, section) not in track.adds:
                continue
            done = tuple(e for e in section.exercises if e.tier in exercise_tiers)
            chosen.append(Slot(lesson, section, section.room_minutes
                               + sum(e.room_minutes for e in done), done))
    return chosen


def edition_numbers(track: Track, all_lessons: list[Lesson]) -> dict[str, dict[str, str]]:
    """Lesson -> its sections' numbers in the track's edition: the sections the track teaches
    are numbered 1, 2, ... in the lesson's order; one it does not teach is "A" and its number in
    the lesson (A3), as the edition's appendix names it."""
    taught = {(slot.lesson.number, slot.section.cell) for slot in slots(track, all_lessons)}
    found = {}
    for lesson in all_lessons:
        kept = [s.number for s in lesson.sections if s.number and (lesson.number, s.cell) in taught]
        new = {number: str(i) for i, number in enumerate(kept, 1)}
        found[lesson.number] = {s.number: new.get(s.number, f"A{s.number}")
                                for s in lesson.sections if s.number}
    return found


class DoesNotFit(ValueError):
    """The track's sections do not fit its days."""


def pack(track: Track, all_lessons: list[Lesson]) -> list[list[tuple[int, Slot]]]:
    """Each day's (start minute, slot) pairs: sections in order, each whole within a block."""
    todo = slots(track, all_lessons)
    days: list[list[tuple[int, Slot]]] = []
    for _ in range(track.days):
        day: list[tuple[int, Slot]] = []
        for begin, end in BLOCKS:
            now = begin
            while todo and now + todo[0].minutes <= end:
                day.append((now, todo[0]))
                now += todo.pop(0).minutes
        days.append(day)
    if todo:
        left = sum(slot.minutes for slot in todo)
        names = "; ".join(f"{s.lesson.number} {s.section.title} ({s.minutes} min)"
                          for s in todo)
        raise DoesNotFit(f"{track.title}: {left} min do not fit ({names})")
    lesson, number = DDP_IN_HAND
    ends = [start + slot.minutes for start, slot in days[0] if slot.lesson.number == lesson
            and any(e.number == number for e in slot.exercises)]
    if not ends or ends[0] > LUNCH[0]:
        raise DoesNotFit(f"{track.title}: lesson {lesson}'s exercise {number} (the DDP "
                         f"conversion) does not end before lunch on day 1 "
                         f"({clock(ends[0]) if ends else 'not on day 1'})")
    return days


def clock(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def day_table(day: list[tuple[int, Slot]], numbers: dict[str, dict[str, str]],
              capstone: str | None = None) -> list[str]:
    """A day's timetable, with the welcome, the breaks, lunch and the wrap-up (with the capstone,
    on the last day); each section under its number in the track's edition."""
    rows = ["| time | lesson | section | tier | min |", "|---|---|---|---|---|",
            f"| {clock(DAY_START)} | | welcome, set-up check | | {WELCOME_MIN} |"]
    for i, (begin, end) in enumerate(BLOCKS):
        for start, slot in day:
            if begin <= start < end:
                done = "".join(f"; exercise {e.number} ({e.minutes} min)"
                               for e in slot.exercises)
                title = slot.section.title
                if slot.section.number:
                    title = (f"{numbers[slot.lesson.number][slot.section.number]}. "
                             + title.split(". ", 1)[1])
                rows.append(f"| {clock(start)} | {slot.lesson.number} | {title}"
                            f"{done} | {slot.section.tier} | {slot.minutes} |")
        if i < len(BLOCKS) - 1:
            pause_start = end
            pause_end = BLOCKS[i + 1][0]
            what = "lunch" if (pause_start, pause_end) == LUNCH else "break"
            rows.append(f"| {clock(pause_start)} | | {what} | | {pause_end - pause_start} |")
    wrap_up = f"capstone: {capstone}; questions" if capstone else "wrap-up, questions"
    rows.append(f"| {clock(DAY_END - WRAP_UP_MIN)} | | {wrap_up} | | {WRAP_UP_MIN} |")
    rows.append(f"| {clock(DAY_END)} | | end | | |")
    return rows


def homework(track: Track, all_lessons: list[Lesson]) -> list[str]:
    """What the track leaves for after the day: the lessons it skips, and in the others the
    sections and exercises it does not teach (in the minutes a learner alone needs)."""
    chosen = slots(track, all_lessons)
    taught = {(s.lesson.number, s.section.cell) for s in chosen}
    done = {(s.lesson.number, e.number) for s in chosen for e in s.exercises}
    lines = []
    for lesson in all_lessons:
        if lesson.number not in track.order:
            total = sum(s.room_minutes + sum(e.room_minutes for e in s.exercises)
                        for s in lesson.sections if s.tier != "instructor")
            lines.append(f"- {lesson.number} {lesson.title}: the whole lesson ({total} min)")
            continue
        for section in lesson.sections:
            if section.tier != "instructor" and section.title != "Exercises" and \
                    (lesson.number, section.cell) not in taught:
                title = (f"A{section.number}. {section.title.split('. ', 1)[1]}"
                         if section.number else section.title)  # as the edition's appendix
                lines.append(f"- {lesson.number} {title} ({section.tier}, "
                             f"{section.room_minutes} min)")
            for e in section.exercises:
                if (lesson.number, e.number) not in done:
                    lines.append(f"- {lesson.number} exercise {e.number} ({e.tier}, "
                                 f"{e.room_minutes} min)")
    return lines


def seconds(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.0f} s"


def render(all_lessons: list[Lesson]) -> str:
    """The whole of docs/schedule.md."""
    out = [
        "# Workshop schedule",
        "",
        "Generated by `make schedule` (`python -m workshop.schedule`) from the notebooks' "
        "section metadata (`workshop/sections.py`); do not edit by hand. Each `##` section "
        "carries its tier, audiences and minutes, and its minutes are at least its words at "
        f"{sections.SPEAKING_WORDS_PER_MIN} a minute, its code at "
        f"{sections.CODE_LINES_PER_MIN} lines a minute and its runs as measured on 2 cores "
        "(`make test` checks that).",
        "",
        "The plans below count what a room of learners needs: for each section and exercise, "
        "its stated minutes or the learners' time, whichever is longer. The learners' time is "
        f"its words read at {sections.READING_WORDS_PER_MIN} a minute, its code typed at "
        f"{sections.TYPED_LINES_PER_MIN} lines a minute, {sections.SECONDS_PER_CELL} s per code "
        f"cell to run it and read its output, and its runs ×{sections.SHARED_RUN_FACTOR} on a "
        f"shared node; an exercise takes ×{sections.EXERCISE_FACTOR} that of its question and "
        "solution, and lesson 05's conversion states its 30 minutes. "
        "[instructors.md](instructors.md#the-learners-time) gives the sources. A section is "
        "never split across a break, and in every plan lesson 05's conversion ends before "
        "lunch on day 1.",
        "",
        "| tier | meaning |",
        "|---|---|",
        *(f"| {tier} | {meaning} |" for tier, meaning in sections.TIERS.items()),
        "",
    ]
    for track in TRACKS:
        chosen = slots(track, all_lessons)
        out += [f"## {track.title} (`{track.name}`)", "", track.about, "",
                f"Lessons {', '.join(track.order)}: {sum(s.minutes for s in chosen)} min of "
                f"sections and exercises in {track.days * TEACHING_MIN} teaching minutes.", ""]
        for number, day in enumerate(pack(track, all_lessons), 1):
            if track.days > 1:
                out += [f"### Day {number}", ""]
            out += day_table(day, edition_numbers(track, all_lessons),
                             track.capstone if number == track.days else None) + [""]
        out += ["After the day:", "", *homework(track, all_lessons), ""]
    out += [
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
    try:
        text = render(lessons())
    except DoesNotFit as error:
        print(f"make schedule: {error}", file=sys.stderr)
        return 1
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
