"""The CPU-time sampler that traced where make test's time goes (benchmarks/cpu_by_process.py)."""

from __future__ import annotations

import sys

from benchmarks.cpu_by_process import kind, sample


def test_kinds_are_read_from_the_command_line_and_the_environment():
    worker = ["python", "-u", "scripts/train_ddp.py", "--epochs", "1"]
    assert kind(worker, {"LOCAL_RANK": "0"}) == "worker train_ddp.py"
    assert kind([sys.executable, "-m", "torch.distributed.run", "train.py"], {}) == \
        "torchrun agent"
    assert kind(["python", "-m", "ipykernel_launcher", "-f", "k.json"], {}) == "Jupyter kernel"
    assert kind(["sleep", "1"], {}) == "other"


def test_a_busy_child_is_seen_with_its_cpu_time():
    by_kind, wall = sample([sys.executable, "-c",
                            "import time\nend = time.process_time() + 1.5\n"
                            "while time.process_time() < end: pass"], interval=0.2)
    assert wall >= 1.5
    assert max(by_kind["other"]) >= 1.0, by_kind  # the spinning child, read while it ran
