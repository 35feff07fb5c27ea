"""The tracks' capstones: lesson 05's script on the room's own GPUs with its speed-up recorded
(the ``ml`` track), and the checklist of the take-home kit's first job on the host cluster (the
``hpc`` track).

``python -m workshop.capstone speedup`` writes the take-home folder (``make take-home``), runs
its ``train_ddp.py`` as the course launches a script, with the ``torchrun`` command it prints,
on 1 process and then on N (every GPU it sees; 2 on a machine without one), with the same batch
per process, and writes what it measured to ``build/capstone/speedup.json``: the commands, the
device, the torch, rank 0's images per second (the median of the epochs after the first, which
also warms up), the speed-up and the efficiency.

``python -m workshop.capstone joblog FILE [--epochs N]`` reads the log of the kit's job (its
Slurm ``train_ddp.sbatch`` or PBS ``train_anywhere.pbs``) and says, one line each, whether the
checklist holds: the job started on its nodes, rank 0 trained every epoch, the checkpoint was
written, no rank failed. It exits 1 when one does not.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "capstone"
EPOCH_LINE = re.compile(r"^epoch (\d+): loss \S+, test accuracy ([\d.]+), [\d.]+ s, "
                        r"(\d+) images/s$", re.M)


def device_name() -> tuple[str, int]:
    """What the runs train on, and how many processes the larger run starts."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0), torch.cuda.device_count()
    return f"CPU ({os.cpu_count()} cores)", 2


def one_run(folder: Path, nproc: int, args: list[str],
            timeout: float = 3600) -> tuple[str, float]:
    """Run the take-home ``train_ddp.py`` on ``nproc`` processes as the course launches a script
    (``ddp_lib.launch``: the torchrun command it prints, a failing rank named, every process
    stopped on a timeout or an interrupt); its command and rank 0's images/s. The data is the
    course's own folder's, which the lessons prepared (rewriting the take-home folder leaves it
    alone)."""
    import ddp_lib

    result = ddp_lib.launch(folder / "train_ddp.py", nproc_per_node=nproc, timeout=timeout,
                            args=[*args, "--checkpoint",
                                  OUT / "checkpoints" / f"capstone-{nproc}.pt"],
                            env={"DDP_WORKSHOP_DATA_DIR": str(ROOT / "data")},
                            run_dir=OUT / "runs" / f"nproc{nproc}")
    epochs = [record["value"] for record in result.records("images_per_s", rank=0)]
    return shlex.join(map(str, result.command)), statistics.median(epochs[1:] or epochs)


def speedup(epochs: int, batch_size: int, train_samples: int, nproc: int | None) -> dict:
    """Both runs, and what they measured."""
    import torch

    from workshop import take_home

    folder = take_home.build(OUT / "take-home")
    device, most = device_name()
    nproc = nproc or most
    if nproc < 2:
        raise SystemExit(f"{device}: one GPU, so there is no speed-up to measure; the capstone "
                         "needs two or more (or none: the CPU, with 2 processes).")
    args = ["--epochs", str(epochs), "--batch-size", str(batch_size),
            "--train-samples", str(train_samples), "--test-samples", "1000"]
    one_command, one = one_run(folder, 1, args)
    # The same batch per process on N processes: N times the data each step, so N times the
    # samples keep the number of steps per epoch (up to the data set's size: the script takes
    # what there is; images/s is the whole set over the epoch's time either way).
    args[args.index("--train-samples") + 1] = str(nproc * train_samples)
    many_command, many = one_run(folder, nproc, args)
    found = {
        "date": datetime.date.today().isoformat(), "device": device, "torch": torch.__version__,
        "commands": [one_command, many_command], "batch_per_process": batch_size,
        "images_per_s": {"1": one, str(nproc): many}, "speedup": many / one,
        "efficiency": many / one / nproc,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    partial = OUT / "speedup.json.partial"
    partial.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
    partial.replace(OUT / "speedup.json")
    print(f"{device}, torch {torch.__version__}: {one:.0f} images/s on 1 process, {many:.0f} on "
          f"{nproc}: speed-up {many / one:.2f}x, efficiency {many / one / nproc:.0%} "
          f"({OUT / 'speedup.json'})")
    return found


@dataclass(frozen=True)
class Item:
    """One line of the checklist: what it asks, whether the log shows it, and the evidence."""

    asked: str
    holds: bool
    evidence: str


JOB_LINE = re.compile(r"^job (\S+) on (.+); (?:rendezvous|store) at (\S+)$", re.M)
SAVED = re.compile(r"^saved (\S+)$", re.M)
# A rank's traceback or torchrun's summary of a failed rank, at a line's start: the agents' own
# log lines carry a prefix (E1129 08:48:23.339000 329 torch/...) and are read apart.
FAILED = re.compile(r"^(Traceback \(most recent call last\)|\S*ChildFailedError|srun: error:|"
                    r".*exited with code [1-9]|.*Killed)", re.M)
# The agents' race at exit (pytorch/pytorch#69520): the first node's agent, which serves the
# rendezvous store, leaves, and another logs that it could not wait at the exit barrier. The
# ranks had finished.
EXIT_BARRIER = re.compile(r"^[EW]\d{4} .*Error waiting on exit barrier", re.M)


def checklist(log: str, epochs: int) -> list[Item]:
    """The take-home job's checklist, read from its log."""
    started = JOB_LINE.search(log)
    trained = [int(match[1]) for match in EPOCH_LINE.finditer(log)]
    last = EPOCH_LINE.findall(log)[-1] if trained else None
    saved = SAVED.search(log)
    failed = FAILED.search(log)
    return [
        Item("the job started on its nodes", bool(started),
             f"job {started[1]} on {started[2]}, the group's store at {started[3]}" if started
             else "no 'job ... on ...' line: did the job start, and is this its log?"),
        Item(f"rank 0 trained all {epochs} epochs", trained == list(range(epochs)),
             f"epochs {trained}; the last: test accuracy {last[1]}, {last[2]} images/s" if last
             else "no 'epoch N: ...' line: look for the error above it"),
        Item("the checkpoint was written", bool(saved),
             f"saved {saved[1]}" if saved else "no 'saved ...' line"),
        Item("no rank failed", not failed,
             "no traceback, no failed task" if not failed else
             f"'{failed[0]}' at line {log[:failed.start()].count(chr(10)) + 1}"),
    ]


def joblog(path: Path, epochs: int) -> int:
    log = path.read_text(encoding="utf-8", errors="replace")
    items = checklist(log, epochs)
    for item in items:
        print(f"  {'✓' if item.holds else '✗'} {item.asked}: {item.evidence}")
    if EXIT_BARRIER.search(log):
        print("  (an agent logged 'Error waiting on exit barrier' with a traceback: the first "
              "node's agent, which serves the rendezvous store, left first, after the ranks had "
              "finished; torchrun's race at exit, pytorch/pytorch#69520, not a failed rank)")
    return 0 if all(item.holds for item in items) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="capstone", required=True)
    ml = commands.add_parser("speedup", help="the ml track's: lesson 05's script, 1 and N "
                                             "processes")
    ml.add_argument("--epochs", type=int, default=3)
    ml.add_argument("--batch-size", type=int, default=128, help="per process")
    ml.add_argument("--train-samples", type=int, default=10_000,
                    help="for one process; N processes train N times as many")
    ml.add_argument("--nproc", type=int, help="default: every GPU, or 2 without one")
    hpc = commands.add_parser("joblog", help="the hpc track's: the take-home job's log, checked")
    hpc.add_argument("log", type=Path)
    hpc.add_argument("--epochs", type=int, default=5, help="as the job file's --epochs")
    args = parser.parse_args(argv)
    if args.capstone == "speedup":
        speedup(args.epochs, args.batch_size, args.train_samples, args.nproc)
        return 0
    return joblog(args.log, args.epochs)


if __name__ == "__main__":
    sys.exit(main())
