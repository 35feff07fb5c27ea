"""A learnable stand-in for CIFAR-10, generated where the real data set cannot be had.

The files are CIFAR-10's own on-disk format (pickled batches of 32x32 RGB images, ten classes),
so torchvision's real loading code reads them: :class:`SyntheticCIFAR10` is a subclass of
``torchvision.datasets.CIFAR10`` that only changes the folder name and the checksums, taken from
the manifest written with the files. Each class is a shape, drawn at a random place and size, in
a colour that leans towards the class's hue, on a random background with noise.

Generation is deterministic, happens in a temporary folder renamed into place (an interrupted
run leaves no half-written data set), and a file lock keeps two processes from doing the work
twice. ``ddp_lib.data`` decides when the stand-in is used.
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
from matplotlib.colors import hsv_to_rgb
from torchvision.datasets import CIFAR10
from torchvision.datasets.utils import check_integrity

SYNTHETIC_CLASSES = ("disc", "square", "triangle", "ring", "plus", "h-stripes", "v-stripes",
                     "diamond", "checker", "x-cross")
SYNTHETIC_TRAIN = 10_000  # five batches of 2,000, like CIFAR-10's five batches of 10,000
SYNTHETIC_TEST = 2_000
SYNTHETIC_SEED = 20_241
MANIFEST = "manifest.json"


class SyntheticCIFAR10(CIFAR10):
    """The generated stand-in, loaded by torchvision's own CIFAR-10 code.

    Only the folder and the checksums differ from ``CIFAR10``; the checksums come from the
    manifest written when the files were generated.
    """

    base_folder = "cifar-10-synthetic-batches-py"

    def __init__(self, root: str | os.PathLike, train: bool = True,
                 transform: Callable | None = None,
                 target_transform: Callable | None = None) -> None:
        manifest = _manifest(Path(root))
        if manifest is None:
            raise RuntimeError(f"No synthetic data set under {Path(root)}: call "
                               "ddp_lib.data.prepare_cifar10() first (on rank 0).")
        self.train_list = manifest["train_list"]
        self.test_list = manifest["test_list"]
        self.meta = {**CIFAR10.meta, "md5": manifest["meta_md5"]}
        super().__init__(root, train=train, transform=transform,
                         target_transform=target_transform, download=False)


def is_whole(root: str | os.PathLike) -> bool:
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

    Deterministic (fixed seed), atomic (built in a temporary folder, then renamed into place)
    and safe when several processes call it at once (a lock; the loser finds it done).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / SyntheticCIFAR10.base_folder
    with _file_lock(root / ".synthetic.lock"):
        if is_whole(root):
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
    meta_md5 = _dump(folder / CIFAR10.meta["filename"],
                     {"label_names": list(SYNTHETIC_CLASSES), "num_cases_per_batch": batch,
                      "num_vis": 3072})
    manifest = {
        "description": "Synthetic stand-in for CIFAR-10 generated by ddp_lib.synthetic_cifar10",
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
    fg = hsv_to_rgb(np.stack([hue, rng.uniform(0.5, 1.0, n), rng.uniform(0.6, 1.0, n)], axis=1))
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
