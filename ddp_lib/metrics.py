"""How a training script hands numbers back to the notebook that launched it.

A script calls ``report("loss", 0.53, step=10)``. Under ``ddp_lib.launch`` the environment
variable ``DDP_LIB_METRICS_FILE`` names a file, and each call appends one JSON line to it; the
launcher reads the file when the run ends. Under plain ``torchrun`` the variable is unset and the
call prints the metric instead, so the same script runs anywhere. Nothing scrapes stdout.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

ENV_VAR = "DDP_LIB_METRICS_FILE"


def report(name: str, value: float, *, step: int | None = None, **extra: Any) -> None:
    """Record one metric of this rank (rank read from ``RANK``, 0 outside torchrun).

    Args:
        name: what is measured, e.g. ``"loss"`` or ``"images_per_s"``.
        value: a number (tensors: pass ``.item()``).
        step: the step or epoch it belongs to, if any.
        **extra: further JSON-serialisable fields kept with the record.
    """
    record = {
        "rank": int(os.environ.get("RANK", "0")),
        "step": step,
        "name": name,
        "value": float(value),
        "time": time.time(),
        **extra,
    }
    path = os.environ.get(ENV_VAR)
    if not path:
        where = f" step={step}" if step is not None else ""
        print(f"[metric] rank={record['rank']}{where} {name}={record['value']:.6g}", flush=True)
        return
    line = (json.dumps(record) + "\n").encode()
    # One write() on an O_APPEND file: lines from several ranks never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def report_weights(model: Any) -> None:
    """Report a fingerprint of this rank's weights: their sum, and a SHA-256 of their bytes.

    DDP keeps every rank's copy of the weights identical, bit for bit; the notebooks check that
    claim by comparing the ranks' fingerprints (``LaunchResult.fingerprints``). The hash lives
    here, not in the lesson scripts, because it is a measurement, not part of training.

    Args:
        model: any ``torch.nn.Module`` (a DDP wrapper included: its parameters are the model's).
    """
    import torch  # only the scripts that report weights pay for the import

    with torch.no_grad():
        weights = torch.cat([p.detach().flatten().float().cpu() for p in model.parameters()])
    report("weights_sum", weights.double().sum().item(),
           sha256=hashlib.sha256(weights.numpy().tobytes()).hexdigest())


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
