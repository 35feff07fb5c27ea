"""How a training script hands numbers back to the notebook that launched it: the reading side.

A script calls ``report("loss", 0.53, step=10)`` (``course_helpers.report``). A course launch sets
``DDP_LIB_METRICS_FILE`` to a file of its run folder; each call appends one JSON line to it, and
the launch reads the file when the run ends. Nothing scrapes stdout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ENV_VAR = "DDP_LIB_METRICS_FILE"  # course_helpers.METRICS_ENV: the writing side


def read(path: str | Path) -> list[dict[str, Any]]:
    """All records in a metrics file, in the order they were written (missing file: none)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            records.append(json.loads(line))
    return records
