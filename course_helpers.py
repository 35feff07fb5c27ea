"""What the lesson scripts share besides PyTorch itself: the device rule, the data, the models,
and ``report``.

It needs torch and torchvision only. ``make take-home`` copies it beside the lessons' final
scripts, so ``torchrun train_ddp.py`` runs anywhere; in the course it is part of the project.
The distributed code stays in the scripts. Two things here are lesson text all the same, shown
where they are taught: the device rule (lesson 00 prints ``backend_and_device`` whole, and every
script calls it, so the rule is written once), and one commented import below that works around
a torch behaviour (docs/compatibility.md).

- **Data.** ``prepare_cifar10()`` makes sure a data set is under ``DATA_DIR``: the real CIFAR-10
  if it is there or torchvision can download it; otherwise (offline, or
  ``DDP_WORKSHOP_DATASET=synthetic``) a generated stand-in in CIFAR-10's own format whose ten
  classes are shapes, learnable like the real ones. ``cifar10()`` loads whichever is there with
  torchvision's own CIFAR-10 code. In a distributed script one process per machine (local rank
  0) prepares, since a machine may have a disk of its own (a pod), and the others wait at a
  barrier; preparing is done under a file lock, and generating is deterministic and atomic.
- **Models.** ``SmallCNN`` (62k parameters) and ``resnet18_cifar`` (11M).
- **Numbers for the notebook.** ``report(name, value)`` appends one JSON line to the file that
  ``DDP_LIB_METRICS_FILE`` names (a course launch sets it); without it, it does nothing, so a
  script prints only what it prints itself.
- **Device and threads.** ``backend_and_device()``: lesson 00's rule, which backend and device
  this process uses; ``threads_per_process()``: its share of the cores.
- **A clean ending.** ``settle_before_destroy()``: the pause every script takes before
  ``destroy_process_group``, for a bug of torch 2.4 to 2.7 (lesson 00, section 4).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Before any script's init_process_group: torch.distributed.nn keeps the default group of the
# moment it is imported, and DDP imports it when constructed (torch 2.14, through torch._dynamo).
# Imported later, the group outlives destroy_process_group and a Gloo thread can abort the rank
# at exit; imported now, it holds none. torchvision 0.29 imports it too, 0.19 not; no upstream
# issue yet (docs/compatibility.md).
import torch.distributed.nn  # noqa: F401
import torch.nn.functional as F
from torch import nn
from torchvision.datasets import CIFAR10
from torchvision.datasets.utils import check_integrity
from torchvision.models import resnet18

DATA_DIR = Path(os.environ.get("DDP_WORKSHOP_DATA_DIR", Path(__file__).resolve().parent / "data"))
SOURCE_ENV = "DDP_WORKSHOP_DATASET"  # "auto" (default), "cifar10" or "synthetic"
SOURCES = ("auto", "cifar10", "synthetic")
METRICS_ENV = "DDP_LIB_METRICS_FILE"

# Per-channel statistics of the real CIFAR-10 training set, used to normalise inputs.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR10_TRAIN, CIFAR10_TEST = 50_000, 10_000  # what the real data set's files always hold

SYNTHETIC_CLASSES = ("disc", "square", "triangle", "ring", "plus", "h-stripes", "v-stripes",
                     "diamond", "checker", "x-cross")
SYNTHETIC_TRAIN = 10_000  # five batches of 2,000, like CIFAR-10's five batches of 10,000
SYNTHETIC_TEST = 2_000
SYNTHETIC_SEED = 20_241
MANIFEST = "manifest.json"


# --- Data ---------------------------------------------------------------------------------------

def requested_source() -> str:
    """The data set asked for through ``DDP_WORKSHOP_DATASET`` (default ``"auto"``)."""
    source = os.environ.get(SOURCE_ENV, "auto").strip().lower() or "auto"
    if source not in SOURCES:
        raise ValueError(f"{SOURCE_ENV} must be one of {SOURCES}, got {source!r}")
    return source


def which(root: str | os.PathLike = DATA_DIR, source: str | None = None) -> str | None:
    """Which data set ``cifar10()`` would load: ``"cifar10"``, ``"synthetic"`` or ``None``."""
    root = Path(root)
    source = source or requested_source()
    real = [*CIFAR10.train_list, *CIFAR10.test_list,
            [CIFAR10.meta["filename"], CIFAR10.meta["md5"]]]
    if source != "synthetic" and all(check_integrity(root / CIFAR10.base_folder / name, md5)
                                     for name, md5 in real):
        return "cifar10"
    if source != "cifar10" and synthetic_is_whole(root):
        return "synthetic"
    return None


def prepare_cifar10(root: str | os.PathLike = DATA_DIR, source: str | None = None,
                    verbose: bool = True) -> str:
    """Make sure a data set is on disk; return ``"cifar10"`` or ``"synthetic"``.

    Args:
        root: the data folder (``DATA_DIR`` by default).
        source: ``"auto"`` (real if it can be had, else synthetic), ``"cifar10"`` (real or
            fail), ``"synthetic"``; ``None`` reads ``DDP_WORKSHOP_DATASET``.
        verbose: say which data set is used and why.
    """
    root = Path(root)
    source = source or requested_source()
    root.mkdir(parents=True, exist_ok=True)
    # One process per machine prepares; machines that share the folder take turns, and the
    # second finds the files there.
    with _file_lock(root / ".prepare.lock"):
        found = which(root, source)
        if found is None and source != "synthetic":
            try:
                CIFAR10(str(root), train=True, download=True)
                found = "cifar10"
            except OSError as exc:  # URLError is an OSError: no network, DNS, proxy ...
                if source == "cifar10":
                    raise RuntimeError(f"CIFAR-10 could not be downloaded ({exc}). Put "
                                       f"cifar-10-python.tar.gz under {root}, or set "
                                       f"{SOURCE_ENV}=synthetic.") from exc
                if verbose:
                    print(f"CIFAR-10 could not be downloaded ({exc}).")
        if found is None:
            generate_synthetic(root)
            found = "synthetic"
    if verbose:
        print(describe(found, root))
    return found


def cifar10(train: bool = True, transform: Callable | None = None,
            root: str | os.PathLike = DATA_DIR) -> CIFAR10:
    """Load the prepared data set (real CIFAR-10 if present, else the synthetic stand-in)."""
    found = which(root)
    if found is None:
        raise RuntimeError(f"No data set under {Path(root)}: call prepare_cifar10() first (on "
                           "each machine's local rank 0, then a barrier, in a distributed "
                           "script).")
    cls = CIFAR10 if found == "cifar10" else SyntheticCIFAR10
    return cls(str(root), train=train, transform=transform)


def sample_counts(root: str | os.PathLike = DATA_DIR,
                  source: str | None = None) -> tuple[int, int]:
    """How many training and test images the lessons will have, without preparing anything.

    Those of the data set on disk that ``cifar10()`` loads; with none there yet, those of the one
    ``prepare_cifar10()`` starts with: the stand-in when it is asked for, else the real
    CIFAR-10's, which it downloads. A plan that took its sizes from elsewhere, and then sliced
    the data set, would silently train on fewer.
    """
    root = Path(root)
    source = source or requested_source()
    found = which(root, source)
    if found == "synthetic":
        return (len(SyntheticCIFAR10(root, train=True)),
                len(SyntheticCIFAR10(root, train=False)))
    if found == "cifar10" or source != "synthetic":
        return CIFAR10_TRAIN, CIFAR10_TEST
    return SYNTHETIC_TRAIN, SYNTHETIC_TEST


def describe(found: str, root: str | os.PathLike = DATA_DIR) -> str:
    """One sentence for a person: which data set the lesson is using."""
    if found == "cifar10":
        return (f"Data: the real CIFAR-10 ({CIFAR10_TRAIN:,} + {CIFAR10_TEST:,} images) in "
                f"{Path(root)}.")
    return (f"Data: the SYNTHETIC stand-in for CIFAR-10 ({SYNTHETIC_TRAIN:,} + {SYNTHETIC_TEST:,} "
            f"generated images of 10 shape classes) in {Path(root) / SyntheticCIFAR10.base_folder}."
            " Accuracies are not comparable with published CIFAR-10 results.")


class SyntheticCIFAR10(CIFAR10):
    """The generated stand-in, loaded by torchvision's own CIFAR-10 code.

    Only the folder and the checksums differ from ``CIFAR10``; the checksums come from the
    manifest written with the files.
    """

    base_folder = "cifar-10-synthetic-batches-py"

    def __init__(self, root: str | os.PathLike, train: bool = True,
                 transform: Callable | None = None,
                 target_transform: Callable | None = None) -> None:
        manifest = _manifest(Path(root))
        if manifest is None:
            raise RuntimeError(f"No synthetic data set under {Path(root)}: call "
                               "prepare_cifar10() first (on each machine's local rank 0).")
        self.train_list = manifest["train_list"]
        self.test_list = manifest["test_list"]
        self.meta = {**CIFAR10.meta, "md5": manifest["meta_md5"]}
        super().__init__(root, train=train, transform=transform,
                         target_transform=target_transform, download=False)


def synthetic_is_whole(root: str | os.PathLike) -> bool:
    """Whether every generated file is under ``root`` with the checksum its manifest records."""
    folder = Path(root) / SyntheticCIFAR10.base_folder
    manifest = _manifest(Path(root))
    if manifest is None:
        return False
    files = [*manifest["train_list"], *manifest["test_list"],
             [CIFAR10.meta["filename"], manifest["meta_md5"]]]
    return all(check_integrity(folder / name, md5) for name, md5 in files)


def _manifest(root: Path) -> dict | None:
    path = root / SyntheticCIFAR10.base_folder / MANIFEST
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def generate_synthetic(root: str | os.PathLike) -> Path:
    """Write the synthetic data set in CIFAR-10's format under ``root``; return its folder.

    Deterministic (fixed seed) and atomic (built in a temporary folder, then renamed into
    place). Processes that may call it at once go through ``prepare_cifar10``, which holds a lock.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / SyntheticCIFAR10.base_folder
    if synthetic_is_whole(root):
        return final
    tmp = Path(tempfile.mkdtemp(prefix=".synthetic-", dir=root))
    try:
        _write_batches(tmp)
        if final.exists():  # a broken earlier attempt: replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


@contextlib.contextmanager
def _file_lock(path: Path):
    try:
        import fcntl
    except ImportError:  # not POSIX: the atomic rename alone keeps the data set whole
        yield
        return
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write_batches(folder: Path) -> None:
    rng = np.random.default_rng(SYNTHETIC_SEED)
    batch = SYNTHETIC_TRAIN // 5
    names = [f"data_batch_{i}" for i in range(1, 6)]
    checksums = {}
    for name, count in [(name, batch) for name in names] + [("test_batch", SYNTHETIC_TEST)]:
        labels = rng.integers(0, 10, size=count)
        images = synthetic_images(labels, rng)
        checksums[name] = _dump(folder / name, {
            "batch_label": f"synthetic {name}",
            "labels": labels.tolist(),
            "data": images.reshape(count, -1),  # CIFAR layout: 1024 R, 1024 G, 1024 B
            "filenames": [f"{SYNTHETIC_CLASSES[y]}_{i:05d}.png" for i, y in enumerate(labels)],
        })
    meta_md5 = _dump(folder / CIFAR10.meta["filename"],
                     {"label_names": list(SYNTHETIC_CLASSES), "num_cases_per_batch": batch,
                      "num_vis": 3072})
    manifest = {
        "description": "Synthetic stand-in for CIFAR-10 generated by course_helpers.py",
        "seed": SYNTHETIC_SEED,
        "train_list": [[n, checksums[n]] for n in names],
        "test_list": [["test_batch", checksums["test_batch"]]],
        "meta_md5": meta_md5,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")


def _dump(path: Path, obj: dict) -> str:
    data = pickle.dumps(obj, protocol=2)
    path.write_bytes(data)
    return hashlib.md5(data).hexdigest()


def synthetic_images(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Images (N, 3, 32, 32) uint8 of the shape classes in ``labels``.

    The shape decides the class. Half of the images are drawn in their class's hue, the others
    in a random one, so colour is a useful but unreliable hint; position, size, background and
    noise vary, so a model has to look at the shape to do well.
    """
    n = len(labels)
    coords = np.arange(32, dtype=np.float32) + 0.5
    cx = rng.uniform(10, 22, size=(n, 1, 1)).astype(np.float32)
    cy = rng.uniform(10, 22, size=(n, 1, 1)).astype(np.float32)
    radius = rng.uniform(5.5, 10, size=(n, 1, 1)).astype(np.float32)
    dx = (coords[None, None, :] - cx) / radius
    dy = (coords[None, :, None] - cy) / radius
    mask = np.zeros((n, 32, 32), dtype=bool)
    for k in range(10):
        idx = labels == k
        mask[idx] = _shape_mask(k, dx[idx], dy[idx])

    class_hue = labels / 10.0
    hue = np.where(rng.random(n) < 0.5, class_hue, rng.random(n))
    fg = _hsv_to_rgb(hue, rng.uniform(0.5, 1.0, n), rng.uniform(0.6, 1.0, n))
    bg = rng.uniform(0.0, 0.45, size=(n, 3))
    m = mask[:, None, :, :]
    img = np.where(m, fg[:, :, None, None], bg[:, :, None, None])
    img = img + rng.normal(0.0, 0.08, size=img.shape)
    return (np.clip(img, 0.0, 1.0) * 255).round().astype(np.uint8)


def _hsv_to_rgb(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(N, 3) RGB colours from hue, saturation and value in [0, 1] (the six-sector formula)."""
    i = (h * 6.0).astype(int) % 6
    f = h * 6.0 - (h * 6.0).astype(int)
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    sectors = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    rgb = np.empty((len(h), 3))
    for k, sector in enumerate(sectors):
        rgb[i == k] = np.stack(sector, axis=1)[i == k]
    return rgb


def _shape_mask(k: int, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    box = (np.abs(dx) < 1) & (np.abs(dy) < 1)
    d = np.sqrt(dx**2 + dy**2)
    masks = {
        0: lambda: d < 1,
        1: lambda: (np.abs(dx) < 0.8) & (np.abs(dy) < 0.8),
        2: lambda: (dy < 0.8) & (np.abs(dx) < (dy + 1.0) / 1.8),
        3: lambda: (d > 0.6) & (d < 1),
        4: lambda: box & ((np.abs(dx) < 0.3) | (np.abs(dy) < 0.3)),
        5: lambda: box & (np.floor((dy + 1) * 2.5) % 2 == 0),
        6: lambda: box & (np.floor((dx + 1) * 2.5) % 2 == 0),
        7: lambda: np.abs(dx) + np.abs(dy) < 1,
        8: lambda: box & ((np.floor((dx + 1) * 2) + np.floor((dy + 1) * 2)) % 2 == 0),
        9: lambda: box & ((np.abs(dx - dy) < 0.35) | (np.abs(dx + dy) < 0.35)),
    }
    return masks[k]()


# --- Models -------------------------------------------------------------------------------------

class SmallCNN(nn.Module):
    """The CNN of PyTorch's CIFAR-10 tutorial: two conv layers, three linear layers (62k params).

    Small enough to train in seconds on a CPU, so lessons can repeat runs and compare them.
    """

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def resnet18_cifar(num_classes: int = 10) -> nn.Module:
    """ResNet-18 for 32x32 images (11M params): a 3x3 first convolution and no max-pool.

    The ImageNet stem (7x7 stride-2 convolution, then max-pool) would shrink a 32x32 image to
    8x8 before the first residual block and throw most of it away.
    """
    model = resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


# --- Numbers for the notebook -------------------------------------------------------------------

def report(name: str, value: float, *, step: int | None = None, **extra: Any) -> None:
    """Record one metric of this rank (``RANK``, 0 outside torchrun) for the launching notebook.

    One JSON line, appended with one ``write()`` to the ``O_APPEND`` file that
    ``DDP_LIB_METRICS_FILE`` names, so lines from several ranks never interleave. Without the
    variable (plain ``torchrun``) it does nothing.
    """
    path = os.environ.get(METRICS_ENV)
    if not path:
        return
    record = {"rank": int(os.environ.get("RANK", "0")), "step": step, "name": name,
              "value": float(value), "time": time.time(), **extra}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def report_weights(model: nn.Module) -> None:
    """Report a fingerprint of this rank's weights: their sum, and a SHA-256 of their bytes.

    DDP keeps every rank's copy identical, bit for bit; the notebooks compare the ranks'
    fingerprints to show it.
    """
    if not os.environ.get(METRICS_ENV):
        return
    with torch.no_grad():
        weights = torch.cat([p.detach().flatten().float().cpu() for p in model.parameters()])
    report("weights_sum", weights.double().sum().item(),
           sha256=hashlib.sha256(weights.numpy().tobytes()).hexdigest())


# --- Device and threads --------------------------------------------------------------------------

def settle_before_destroy() -> None:
    """Pause 0.2 s before ``dist.destroy_process_group()`` (lesson 00, section 4).

    On torch 2.4 to 2.7 the destroy can deadlock now and then: it joins Gloo's threads while
    holding Python's lock, which one of them needs to free a tensor (one launch in five of lesson
    10's script on 2 cores). pytorch/pytorch#154976 fixed it in 2.8; there the pause costs 0.2 s.
    """
    time.sleep(0.2)


def backend_and_device(threads: int | None = None) -> tuple[str, torch.device]:
    """Lesson 00's device rule: this process's backend and device (made current), for every
    machine a learner has.

    - No GPU in sight, or ``DDP_BACKEND=gloo``: Gloo on the CPU, with this process's share of
      the cores (``threads``, else ``threads_per_process()``), because torchrun sets
      ``OMP_NUM_THREADS=1`` when it starts several processes.
    - A GPU for every process of this machine: NCCL on ``cuda:LOCAL_RANK``.
    - One GPU that a launcher gave this process alone (``srun --gpus-per-task=1``, ``mpiexec
      -gpus-per-proc 1``, a site's script that sets ``CUDA_VISIBLE_DEVICES`` per rank): NCCL
      on ``cuda:0``. torchrun never does that: all the processes it starts see its GPUs.
    - Fewer GPUs than processes (one GPU shared included): stop, and say how to go on. NCCL
      refuses two processes on one GPU, and several on the CPU is a choice to make on purpose.
    - ``DDP_BACKEND=nccl`` and no GPU: stop. A job file for GPUs sets it, so that a job that
      lost its GPUs (an empty ``CUDA_VISIBLE_DEVICES``, a driver too old for this torch) fails
      instead of training on the CPU.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = torch.cuda.device_count()  # this machine's, or only this process's own
    backend = os.environ.get("DDP_BACKEND") or ("nccl" if gpus else "gloo")
    if backend != "nccl":
        torch.set_num_threads(threads or threads_per_process(local_world_size))
        return backend, torch.device("cpu")
    if gpus == 0:
        raise RuntimeError("DDP_BACKEND=nccl, but this process sees no GPU: check "
                           "CUDA_VISIBLE_DEVICES, the job's GPU request and nvidia-smi")
    own_gpu = gpus == 1 and gpu_set_for_this_process()
    if gpus < local_world_size and not own_gpu:
        raise RuntimeError(f"{gpus} GPU(s) for {local_world_size} processes on this machine: "
                           f"start one process per GPU (--nproc-per-node={gpus}), or set "
                           "DDP_BACKEND=gloo to train on the CPU")
    device = torch.device("cuda", 0 if own_gpu else local_rank)
    torch.cuda.set_device(device)
    return "nccl", device


def gpu_set_for_this_process() -> bool:
    """Whether a launcher chose this process's GPUs for it alone: it set
    ``CUDA_VISIBLE_DEVICES`` to another value than the process that started this one has.

    Processes that inherit the variable unchanged (torchrun's, or mpiexec's without GPU
    binding) see the same GPUs as their siblings. Linux lists a parent's environment under
    ``/proc``, where another user's is not ours to read: that of a daemon such as
    ``slurmstepd``, which sets the variable per task for ``srun --gpus-per-task``.
    """
    mine = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mine is None:
        return False
    try:
        parent = Path(f"/proc/{os.getppid()}/environ").read_bytes().split(b"\0")
    except PermissionError:  # a scheduler's daemon started this process, and set the variable
        return True
    except OSError:  # no /proc: not Linux
        return False
    return f"CUDA_VISIBLE_DEVICES={mine}".encode() not in parent


def usable_cpu_cores() -> int:
    """Cores a process may run on: its affinity mask (which Slurm, mpiexec and containers
    narrow), and no more than a container's CPU quota (cgroup v2 ``cpu.max``) allows."""
    if not hasattr(os, "sched_getaffinity"):
        return max(1, os.cpu_count() or 1)
    cores = len(os.sched_getaffinity(0))
    quota = cpu_quota()
    return max(1, min(cores, quota) if quota else cores)


def cpu_quota(cgroup_file: str | os.PathLike = "/proc/self/cgroup",
              root: str | os.PathLike = "/sys/fs/cgroup") -> int | None:
    """The cores a cgroup v2 CPU quota allows this process (``cpu.max``, rounded up), or
    ``None`` without one: a Kubernetes pod's ``limits.cpu``, ``docker run --cpus``.

    Args:
        cgroup_file, root: where the process's group is named, and where cgroups are mounted.
    """
    root = Path(root)
    try:
        lines = Path(cgroup_file).read_text().splitlines()
        unified = [line[3:] for line in lines if line.startswith("0::")]  # v2: "0::/the/group"
        if not unified:
            return None
        group = root / unified[0].lstrip("/")
        limits = []
        for folder in (group, *group.parents):  # a parent's quota binds its children too
            if (folder / "cpu.max").exists():
                quota, period = (folder / "cpu.max").read_text().split()
                if quota != "max":
                    limits.append(max(1, -(-int(quota) // int(period))))
            if folder == root:
                break
    except (OSError, ValueError):
        return None
    return min(limits, default=None)


def threads_per_process(local_world_size: int | None = None) -> int:
    """CPU threads this process should use: its usable cores, divided between the processes
    of this machine where they share them.

    torchrun sets ``OMP_NUM_THREADS=1`` when it starts more than one worker per node and the
    variable is unset, which leaves cores idle when there are fewer processes than cores; each
    process using every core is worse, because the processes then fight over them. A launcher
    that bound this process to cores of its own (``srun -c`` with task affinity, ``mpiexec
    -bind-to core:N``, PALS's ``--cpu-bind depth``) left it a narrower mask than its parent's:
    those cores are its alone, and are not divided again. torchrun's workers share torchrun's.

    Args:
        local_world_size: processes on this machine; ``None`` reads ``LOCAL_WORLD_SIZE``
            (set by torchrun), else 1.
    """
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cores = usable_cpu_cores()
    if bound_by_launcher():
        return cores
    return max(1, cores // max(1, local_world_size))


def bound_by_launcher() -> bool:
    """Whether this process may run on fewer cores than the process that started it."""
    if not hasattr(os, "sched_getaffinity"):
        return False
    try:
        return os.sched_getaffinity(0) < os.sched_getaffinity(os.getppid())
    except OSError:  # the parent is gone, or not ours to look at
        return False


def thread_ids() -> set[int]:
    """The ids of this process's threads, from ``/proc`` (Linux; elsewhere none are listed).

    Gloo runs the collectives on threads of its own, started by the group's first collective,
    and ``destroy_process_group`` must stop them. Their names differ between releases
    (``pt_gloo_runloop`` from torch 2.11, the main thread's name before), their ids do not:
    lesson 05's script keeps the ids that appeared between ``init_process_group`` and its first
    barrier, and looks for them after destroying the group.
    """
    tasks = Path("/proc/self/task")
    return {int(task.name) for task in tasks.iterdir()} if tasks.is_dir() else set()
