"""CIFAR-10 for the lessons: the real data set where it can be had, a learnable stand-in where not.

``prepare_cifar10()`` makes sure a data set is on disk under ``data/``:

1. the real CIFAR-10, if it is already there or torchvision can download it;
2. otherwise (offline, or ``DDP_WORKSHOP_DATASET=synthetic`` as in CI) a generated data set in
   CIFAR-10's own on-disk format (pickled batches of 32x32 RGB images, ten classes) whose classes
   are learnable: each class is a shape, drawn at a random place and size, in a colour that
   leans towards the class's hue, on a random background with noise.

``cifar10()`` then loads whichever is there. The stand-in is read by :class:`SyntheticCIFAR10`,
a subclass of ``torchvision.datasets.CIFAR10`` that only changes the folder name and the
checksums, so torchvision's real loading code (integrity check, unpickling, PIL images) runs.

In a distributed script only rank 0 calls ``prepare_cifar10()``; the other ranks wait at a
barrier and then call ``cifar10()``. Preparing is also safe without that discipline: generation
is deterministic, happens in a temporary folder renamed into place (an interrupted run leaves no
half-written data set), and a file lock keeps two processes from doing the work twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from torchvision.datasets import CIFAR10

DATA_DIR = Path(os.environ.get("DDP_WORKSHOP_DATA_DIR",
                               Path(__file__).resolve().parents[1] / "data"))
SOURCE_ENV = "DDP_WORKSHOP_DATASET"  # "auto" (default), "cifar10" or "synthetic"
SOURCES = ("auto", "cifar10", "synthetic")

# Per-channel statistics of the real CIFAR-10 training set, used to normalise inputs.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

SYNTHETIC_CLASSES = ("disc", "square", "triangle", "ring", "plus", "h-stripes", "v-stripes",
                     "diamond", "checker", "x-cross")
SYNTHETIC_TRAIN = 10_000  # five batches of 2,000, like CIFAR-10's five batches of 10,000
SYNTHETIC_TEST = 2_000
SYNTHETIC_SEED = 20_241


class SyntheticCIFAR10(CIFAR10):
    """The generated stand-in, loaded by torchvision's own CIFAR-10 code.

    Only the folder and the checksums differ from ``CIFAR10``; the checksums come from the
    manifest written when the files were generated.
    """

    base_folder = "cifar-10-synthetic-batches-py"

    def __init__(self, root: str | os.PathLike = DATA_DIR, train: bool = True,
                 transform: Callable | None = None,
                 target_transform: Callable | None = None) -> None:
        manifest_path = Path(root) / self.base_folder / "manifest.json"
        if not manifest_path.exists():
            raise RuntimeError(f"No synthetic data set under {Path(root)}: call "
                               "ddp_lib.data.prepare_cifar10() first (on rank 0).")
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        self.train_list = manifest["train_list"]
        self.test_list = manifest["test_list"]
        self.meta = {**CIFAR10.meta, "md5": manifest["meta_md5"]}
        super().__init__(root, train=train, transform=transform,
                         target_transform=target_transform, download=False)


def requested_source() -> str:
    """The data set asked for through ``DDP_WORKSHOP_DATASET`` (default ``"auto"``)."""
    source = os.environ.get(SOURCE_ENV, "auto").strip().lower() or "auto"
    if source not in SOURCES:
        raise ValueError(f"{SOURCE_ENV} must be one of {SOURCES}, got {source!r}")
    return source


def _integrity(cls: type[CIFAR10], root: Path) -> bool:
    probe = cls.__new__(cls)
    probe.root = str(root)
    if cls is SyntheticCIFAR10:
        manifest = root / cls.base_folder / "manifest.json"
        if not manifest.exists():
            return False
        m = json.loads(manifest.read_text(encoding="utf-8"))
        probe.train_list, probe.test_list = m["train_list"], m["test_list"]
    return probe._check_integrity()


def which(root: str | os.PathLike = DATA_DIR, source: str | None = None) -> str | None:
    """Which data set ``cifar10()`` would load: ``"cifar10"``, ``"synthetic"`` or ``None``."""
    root = Path(root)
    source = source or requested_source()
    if source != "synthetic" and _integrity(CIFAR10, root):
        return "cifar10"
    if source != "cifar10" and _integrity(SyntheticCIFAR10, root):
        return "synthetic"
    return None


def prepare_cifar10(root: str | os.PathLike = DATA_DIR, source: str | None = None,
                    verbose: bool = True) -> str:
    """Make sure a data set is on disk; return ``"cifar10"`` or ``"synthetic"``.

    Args:
        root: the data folder (``data/`` of the course by default).
        source: ``"auto"`` (real if it can be had, else synthetic), ``"cifar10"`` (real or
            fail), ``"synthetic"``; ``None`` reads ``DDP_WORKSHOP_DATASET``.
        verbose: say which data set is used and why.
    """
    root = Path(root)
    source = source or requested_source()
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
        raise RuntimeError(f"No data set under {Path(root)}: call ddp_lib.data.prepare_cifar10() "
                           "first (on rank 0, then a barrier in a distributed script).")
    cls = CIFAR10 if found == "cifar10" else SyntheticCIFAR10
    return cls(str(root), train=train, transform=transform)


def sample_counts(root: str | os.PathLike = DATA_DIR) -> tuple[int, int]:
    """How many training and test images the lessons will really have, counted from the files.

    The data set is prepared first if need be (found, downloaded or generated), so the counts are
    those of the data set every later ``cifar10()`` call loads: 50,000 + 10,000 for the real
    CIFAR-10, fewer for the synthetic stand-in. Plans that take a number of samples from
    elsewhere, and then slice the data set, would silently train on fewer.
    """
    prepare_cifar10(root, verbose=False)
    return len(cifar10(train=True, root=root)), len(cifar10(train=False, root=root))


def describe(found: str, root: str | os.PathLike = DATA_DIR) -> str:
    """One sentence for a person: which data set the lesson is using."""
    if found == "cifar10":
        return f"Data: the real CIFAR-10 (50,000 + 10,000 images) in {Path(root)}."
    return (f"Data: the SYNTHETIC stand-in for CIFAR-10 ({SYNTHETIC_TRAIN:,} + {SYNTHETIC_TEST:,} "
            f"generated images of 10 shape classes) in {Path(root) / SyntheticCIFAR10.base_folder}."
            " Accuracies are not comparable with published CIFAR-10 results.")


def generate_synthetic(root: str | os.PathLike = DATA_DIR) -> Path:
    """Write the synthetic data set in CIFAR-10's format under ``root``; return its folder.

    Deterministic (fixed seed), atomic (built in a temporary folder, then renamed into place)
    and safe when several processes call it at once (a lock; the loser finds it done).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / SyntheticCIFAR10.base_folder
    with _file_lock(root / ".synthetic.lock"):
        if _integrity(SyntheticCIFAR10, root):
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
    splits = [(name, batch) for name in names] + [("test_batch", SYNTHETIC_TEST)]
    checksums = {}
    for name, count in splits:
        labels = rng.integers(0, 10, size=count)
        images = synthetic_images(labels, rng)
        entry = {
            "batch_label": f"synthetic {name}",
            "labels": labels.tolist(),
            "data": images.reshape(count, -1),  # CIFAR layout: 1024 R, 1024 G, 1024 B
            "filenames": [f"{SYNTHETIC_CLASSES[y]}_{i:05d}.png" for i, y in enumerate(labels)],
        }
        checksums[name] = _dump(folder / name, entry)
    meta_md5 = _dump(folder / "batches.meta", {"label_names": list(SYNTHETIC_CLASSES),
                                               "num_cases_per_batch": batch, "num_vis": 3072})
    manifest = {
        "description": "Synthetic stand-in for CIFAR-10 generated by ddp_lib.data",
        "seed": SYNTHETIC_SEED,
        "train_list": [[n, checksums[n]] for n in names],
        "test_list": [["test_batch", checksums["test_batch"]]],
        "meta_md5": meta_md5,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")


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


def _shape_mask(k: int, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    box = (np.abs(dx) < 1) & (np.abs(dy) < 1)
    d = np.sqrt(dx**2 + dy**2)
    if k == 0:
        return d < 1
    if k == 1:
        return (np.abs(dx) < 0.8) & (np.abs(dy) < 0.8)
    if k == 2:
        return (dy < 0.8) & (np.abs(dx) < (dy + 1.0) / 1.8)
    if k == 3:
        return (d > 0.6) & (d < 1)
    if k == 4:
        return box & ((np.abs(dx) < 0.3) | (np.abs(dy) < 0.3))
    if k == 5:
        return box & (np.floor((dy + 1) * 2.5) % 2 == 0)
    if k == 6:
        return box & (np.floor((dx + 1) * 2.5) % 2 == 0)
    if k == 7:
        return np.abs(dx) + np.abs(dy) < 1
    if k == 8:
        return box & ((np.floor((dx + 1) * 2) + np.floor((dy + 1) * 2)) % 2 == 0)
    return box & ((np.abs(dx - dy) < 0.35) | (np.abs(dx + dy) < 0.35))


def _hsv_to_rgb(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    i = np.floor(h * 6).astype(int) % 6
    f = h * 6 - np.floor(h * 6)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    table = np.stack([np.stack(c, axis=1) for c in
                      ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))])
    return table[i, np.arange(len(h))]
