"""CIFAR-10 for the lessons: the real data set where it can be had, a learnable stand-in where not.

``prepare_cifar10()`` makes sure a data set is on disk under ``data/``:

1. the real CIFAR-10, if it is already there or torchvision can download it;
2. otherwise (offline, or ``DDP_WORKSHOP_DATASET=synthetic`` as in CI) the generated stand-in of
   ``ddp_lib.synthetic_cifar10``, in CIFAR-10's own on-disk format, whose classes are learnable.

``cifar10()`` then loads whichever is there, through torchvision's own CIFAR-10 code.

In a distributed script only rank 0 calls ``prepare_cifar10()``; the other ranks wait at a
barrier and then call ``cifar10()``. Generating the stand-in is also safe without that
discipline: it is deterministic, atomic and done under a file lock.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from torchvision.datasets import CIFAR10
from torchvision.datasets.utils import check_integrity

from ddp_lib.synthetic_cifar10 import (
    SYNTHETIC_TEST,
    SYNTHETIC_TRAIN,
    SyntheticCIFAR10,
    generate_synthetic,
    is_whole,
)

DATA_DIR = Path(os.environ.get("DDP_WORKSHOP_DATA_DIR",
                               Path(__file__).resolve().parents[1] / "data"))
SOURCE_ENV = "DDP_WORKSHOP_DATASET"  # "auto" (default), "cifar10" or "synthetic"
SOURCES = ("auto", "cifar10", "synthetic")

# Per-channel statistics of the real CIFAR-10 training set, used to normalise inputs.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
# The real CIFAR-10's training and test images: what its checksummed files always hold.
CIFAR10_TRAIN = 50_000
CIFAR10_TEST = 10_000


def requested_source() -> str:
    """The data set asked for through ``DDP_WORKSHOP_DATASET`` (default ``"auto"``)."""
    source = os.environ.get(SOURCE_ENV, "auto").strip().lower() or "auto"
    if source not in SOURCES:
        raise ValueError(f"{SOURCE_ENV} must be one of {SOURCES}, got {source!r}")
    return source


def _real_is_whole(root: Path) -> bool:
    """Whether the real CIFAR-10 is unpacked under ``root``, every file with torchvision's md5."""
    folder = root / CIFAR10.base_folder
    files = [*CIFAR10.train_list, *CIFAR10.test_list,
             [CIFAR10.meta["filename"], CIFAR10.meta["md5"]]]
    return all(check_integrity(folder / name, md5) for name, md5 in files)


def which(root: str | os.PathLike = DATA_DIR, source: str | None = None) -> str | None:
    """Which data set ``cifar10()`` would load: ``"cifar10"``, ``"synthetic"`` or ``None``."""
    root = Path(root)
    source = source or requested_source()
    if source != "synthetic" and _real_is_whole(root):
        return "cifar10"
    if source != "cifar10" and is_whole(root):
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


def sample_counts(root: str | os.PathLike = DATA_DIR,
                  source: str | None = None) -> tuple[int, int]:
    """How many training and test images the lessons will have, without preparing anything.

    Those of the data set on disk that ``cifar10()`` loads (the stand-in's counted from its
    files); with none there yet, those of the one ``prepare_cifar10()`` starts with: the stand-in
    when it is asked for, else the real CIFAR-10's 50,000 + 10,000, which it downloads. Plans
    that take a number of samples from elsewhere, and then slice the data set, would silently
    train on fewer. Offline, ``"auto"`` falls back to the stand-in only when preparing, which
    no plan made earlier can know.
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
