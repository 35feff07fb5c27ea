"""Write the folder a learner takes home: every lesson's scripts, ``course_helpers.py``, job files.

Each script is the text its lesson's ``%%write_script`` cell writes, whole (a cell that holds a
change to another script is applied, as the lesson applies it), so the two never differ.
``course_helpers.py`` (the data, the models, ``report``) sits beside them: the folder runs
wherever torch and torchvision are installed, with ``torchrun``, ``mpiexec`` or a cluster's
scheduler, and needs nothing else from this project. The job files are the ones lessons 06 and
10 print, written for lesson 05's script (lesson 10's under PBS's ``mpiexec``), with sizes to
edit.

``python -m workshop.take_home [DEST]`` writes DEST (default build/take-home); ``make take-home``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import nbformat

from ddp_lib import cluster, scripts

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
HELPERS = ROOT / "course_helpers.py"
DEFAULT_DEST = ROOT / "build" / "take-home"
# The scripts that need more than torch and torchvision, for what their lessons show.
ALSO_NEEDS = {"init_methods.py": {"psutil"}, "mpi4py_group.py": {"mpi4py"}}


def lesson_scripts(notebooks: Path = NOTEBOOKS) -> dict[str, tuple[str, str]]:
    """Every script a lesson writes with ``%%write_script`` (an exercise's solution is no lesson
    script): name -> (lesson, text), in order.

    A later lesson that writes an earlier lesson's script again writes the same text (the
    lessons take it from that notebook, ``scripts.from_notebook``); two different texts under
    one name are an error.
    """
    found: dict[str, tuple[str, str]] = {}
    for path in sorted(notebooks.glob("[0-9][0-9]_*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            first, _, body = cell.source.partition("\n")
            written = scripts.header(first) if cell.cell_type == "code" else None
            if written is None or "solution" in cell.metadata.get("tags", []):
                continue  # not a script, or a learner's answer, not a lesson's
            name, text = written[0], scripts.script_of(first, body)  # a --from cell's, whole
            if name in found and scripts.normalised(found[name][1]) != scripts.normalised(text):
                raise ValueError(f"{path.stem} writes {name} differently from {found[name][0]}")
            found.setdefault(name, (path.stem, text))
    return found


# The sizes of the job files: two machines of four GPUs, each process with lesson 01's batch
# divided by the GPUs, so that every step sees lesson 01's 128 images, as lesson 06's job does.
GPUS_PER_NODE = 4
JOB_ARGS = ["--epochs", 5, "--batch-size", 128 // GPUS_PER_NODE]


KUBERNETES_FIRST = f"""\
# First put the scripts where every pod mounts them, from this folder:
#   kubectl create configmap {cluster.SCRIPTS_CONFIGMAP} --from-file=train_ddp.py \\
#       --from-file=course_helpers.py
# The claim below needs a storage class that offers ReadWriteMany (a network file system).
"""


def job_files() -> dict[str, str]:
    """The three job files, for two machines with four GPUs each (edit the sizes to yours)."""
    # Pods share no disk: the scripts come from a ConfigMap, the checkpoint goes to a claim.
    claim = cluster.volume_claim("ddp-workshop-checkpoints")
    trainjob = cluster.trainjob_manifest(
        "train_ddp.py", nodes=2, gpus_per_node=GPUS_PER_NODE, cpus_per_node=32,
        checkpoint_claim=claim["metadata"]["name"],
        args=[*JOB_ARGS, "--checkpoint", f"{cluster.CHECKPOINT_DIR}/train_ddp.pt"])
    return {
        "train_ddp.sbatch": cluster.slurm_script("train_ddp.py", nodes=2,
                                                 gpus_per_node=GPUS_PER_NODE, cpus_per_task=32,
                                                 args=JOB_ARGS),
        # HPE Cray's mpiexec (PALS), as on ALCF's Polaris: qsub refuses a job without a project
        # (-A), and ALCF's without the file systems it uses (-l filesystems).
        "train_anywhere.pbs": cluster.pbs_script("train_anywhere.py", nodes=2,
                                                 gpus_per_node=GPUS_PER_NODE, cpus_per_node=32,
                                                 mpi="pals", queue="debug",
                                                 account="YOUR_PROJECT",
                                                 filesystems=["home", "eagle"], args=JOB_ARGS),
        "train_ddp.trainjob.yaml": KUBERNETES_FIRST + cluster.to_yaml(claim) + "---\n"
                                   + cluster.to_yaml(trainjob),
    }


# The scripts a learner carries to a cluster, and how each runs there; every other script is a
# lesson's demonstration. The torch-only test runs each job file's script (tests/test_take_home.py).
TRAINERS = {
    "train_single.py": ("lesson 01: one device", "`python train_single.py`"),
    "train_ddp.py": ("lesson 05: DDP, one process per GPU",
                     "`torchrun`, `sbatch train_ddp.sbatch`, "
                     "`kubectl apply -f train_ddp.trainjob.yaml`"),
    "train_ddp_resume.py": ("lesson 05's second step: a checkpoint every epoch, `--resume`, "
                            "`--stop-file` (a job that requeues itself near its time limit, "
                            "lesson 06), `--accumulate`", "`torchrun`, `sbatch`"),
    "train_amp.py": ("lesson 07: mixed precision (`--precision bf16` or `fp16`)", "`torchrun`"),
    "train_anywhere.py": ("lesson 10: under torchrun, `srun` or `mpiexec`, unchanged",
                          "`qsub train_anywhere.pbs`, `srun python train_anywhere.py`, "
                          "`mpiexec -n 2 python train_anywhere.py`"),
    "train_fsdp.py": ("lesson 11: FSDP2 (on CPUs from torch 2.9)", "`torchrun`"),
}
# Demonstrations that fail or hang on purpose, for what their lesson shows.
ON_PURPOSE = {
    "broken.py": "rank 1 raises: what a failing rank looks like",
    "eval_on_rank0.py": "a collective only rank 0 calls: hangs unless given `--fixed`",
    "uneven.py": "uneven data: hangs unless given `--fix join` or `--fix sampler`",
    "late_rank.py": "a rank that comes late: `monitored_barrier` names it, and fails",
    "legacy_local_rank.py": "reads `--local_rank`: `torch.distributed.launch` passes "
                            "`--local-rank` and it fails; under `torchrun` every rank reads 0",
    "fit_on_gpu.py": "GPUs only; `--strategy ddp` runs out of memory on purpose",
}


def readme(found: dict[str, tuple[str, str]]) -> str:
    demos: dict[str, list[str]] = {}
    for name, (lesson, _) in found.items():
        if name not in TRAINERS:
            demos.setdefault(lesson, []).append(
                f"`{name}`" + (f" ({ON_PURPOSE[name]})" if name in ON_PURPOSE else ""))
    lines = [
        "# The ddp-workshop scripts",
        "",
        "Every lesson's scripts as the lessons write them, with `course_helpers.py` (the device",
        "rule, the data, the models, `report`) beside them. They need torch and torchvision,",
        "nothing else:",
        "",
        "```bash",
        "torchrun --standalone --nproc-per-node=2 train_ddp.py --epochs 1",
        "mpiexec -n 2 python train_anywhere.py --epochs 1       # lesson 10: any launcher",
        "sbatch train_ddp.sbatch          # Slurm (lesson 06); the sizes are its #SBATCH lines",
        "qsub train_anywhere.pbs          # PBS Pro, HPE Cray's mpiexec (lesson 10): set -A first",
        f"kubectl create configmap {cluster.SCRIPTS_CONFIGMAP} --from-file=train_ddp.py \\",
        "    --from-file=course_helpers.py   # Kubernetes: the pods' copy of the scripts",
        "kubectl apply -f train_ddp.trainjob.yaml  # Kubeflow Trainer (lesson 06)",
        "```",
        "",
        "## What to carry to a cluster",
        "",
        "| script | what it does | how it runs |",
        "|---|---|---|",
        *(f"| `{name}` | {what} | {how} |" for name, (what, how) in TRAINERS.items()
          if name in found),
        "",
        "The data goes to `data/` here (`DDP_WORKSHOP_DATA_DIR` moves it): the real CIFAR-10,",
        "downloaded once, or offline a generated stand-in (`DDP_WORKSHOP_DATASET=synthetic`).",
        "The job files ask for the real CIFAR-10 (`DDP_WORKSHOP_DATASET=cifar10`): compute nodes",
        "are often offline, so prepare it here on the login node before submitting, and a job",
        "that cannot find it stops with an error instead of training on the stand-in:",
        "",
        "```bash",
        "DDP_WORKSHOP_DATASET=cifar10 python -c 'import course_helpers as c; c.prepare_cifar10()'",
        "```",
        "",
        "GPU job files set `DDP_BACKEND=nccl`: a rank that sees no GPU stops instead of training",
        "on the CPU.",
        "`report()` writes only where `DDP_LIB_METRICS_FILE` names a file: here it does nothing.",
        *(f"`{name}` also needs {', '.join(sorted(needs))}." for name, needs in ALSO_NEEDS.items()),
        "",
        "## The lessons' demonstrations",
        "",
        "Each shows one thing, with the arguments its lesson gives it; some fail or hang on",
        "purpose.",
        "",
    ]
    for lesson, names in demos.items():
        lines.append(f"- **{lesson}**: " + ", ".join(names))
    return "\n".join(lines) + "\n"


def build(dest: Path = DEFAULT_DEST) -> Path:
    """Write the folder afresh (in a temporary one, renamed into place) and return it."""
    found = lesson_scripts()
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        for name, (_, body) in found.items():
            scripts.write_script(name, body, directory=partial, quiet=True)
        shutil.copyfile(HELPERS, partial / HELPERS.name)
        for name, text in job_files().items():
            (partial / name).write_text(text, encoding="utf-8")
        (partial / "README.md").write_text(readme(found), encoding="utf-8")
    except BaseException:  # no half-written folder left behind
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", nargs="?", type=Path, default=DEFAULT_DEST)
    dest = build(parser.parse_args(argv).dest)
    count = len(list(dest.glob("*.py"))) - 1
    print(f"Wrote {dest}: {count} scripts, course_helpers.py, 3 job files, README.md.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
