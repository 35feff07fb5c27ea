"""Measurements a lesson keeps for later lessons (lesson 05 compares 01, 02 and 05).

Each lesson saves a small JSON file under ``results/`` beside the notebooks. Writing is atomic,
so a lesson interrupted while saving never leaves a file that a later lesson cannot read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ddp_lib.files import atomic_write_text

RESULTS_DIR = Path("results")


def save(lesson: str, values: dict[str, Any], directory: str | os.PathLike = RESULTS_DIR) -> Path:
    """Write ``values`` (JSON-serialisable) as ``directory/lesson.json``, replacing older ones."""
    return atomic_write_text(Path(directory) / f"{lesson}.json", json.dumps(values, indent=2))


def load(lesson: str, directory: str | os.PathLike = RESULTS_DIR) -> dict[str, Any] | None:
    """What ``lesson`` saved, or ``None`` if it has not been run here yet."""
    path = Path(directory) / f"{lesson}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))
