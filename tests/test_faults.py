"""ddp_lib.launching.faults: a worker killed on purpose, in a real launch, when asked."""

from __future__ import annotations

import time

import pytest

from ddp_lib import RankFailed, launch
from ddp_lib.launching import faults

WAITS_FOR_THE_KILL = """
    import os, sys, time
    from pathlib import Path

    if os.environ["RANK"] == "1":
        Path(sys.argv[1]).touch()
    time.sleep(60)
"""


def test_the_rank_asked_for_is_killed_once_the_file_exists(make_script, workdir):
    script = make_script("waits.py", WAITS_FOR_THE_KILL)
    marker = workdir / "ready"
    killer = faults.kill_rank_when_file_exists(marker, rank=1)
    start = time.time()
    with pytest.raises(RankFailed) as info:
        launch(script, args=[marker], nproc_per_node=2, timeout=60, stream=False)
    killed_at = killer.wait()
    assert killed_at is not None and start < killed_at < time.time()
    assert info.value.rank == 1 and "killed by SIGKILL" in str(info.value)


def test_no_file_no_kill_and_wait_returns_at_once(tmp_path):
    killer = faults.kill_rank_when_file_exists(tmp_path / "never", rank=0)
    start = time.monotonic()
    assert killer.wait() is None
    assert time.monotonic() - start < 1, "wait() stops the watch, it does not sit out limit_s"
