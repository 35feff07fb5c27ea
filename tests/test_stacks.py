"""A hung launch says where each rank was: faulthandler dumps asked for before the stop, read.

The unit tests read real dumps that faulthandler wrote; the launch tests hang real ranks, in a
collective and in plain Python, on one node and on two.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from ddp_lib import LaunchTimeout, launch, launch_nodes
from ddp_lib.launching import stacks

WAITS = """
    import faulthandler
    import sys
    import threading

    ready = threading.Event()


    def helper():
        ready.set()
        threading.Event().wait(30)


    def main():
        threading.Thread(target=helper, daemon=True).start()
        ready.wait()
        faulthandler.dump_traceback(file=sys.stdout, all_threads=True)


    main()
"""

HANGS = """
    import time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    if dist.get_rank() == 0:
        dist.all_reduce(t)  # waits for a peer that never comes
    else:
        while True:  # plain Python that never ends
            time.sleep(0.1)
"""


def test_the_innermost_frame_of_the_script_is_found_in_a_real_dump(tmp_path):
    script = tmp_path / "waits.py"
    script.write_text(textwrap.dedent(WAITS))
    dump = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          check=True, timeout=60).stdout
    assert len(stacks.threads(dump)) == 2
    frame = stacks.innermost_in(dump, script)
    assert (frame.line, frame.function) == (17, "main")  # the main thread: deepest in the script
    assert frame.describe() == "waits.py:17  faulthandler.dump_traceback(file=sys.stdout, " \
                               "all_threads=True)"
    assert stacks.innermost_in(dump, tmp_path / "other.py") is None


def test_where_reads_every_ranks_dump(tmp_path):
    script = tmp_path / "waits.py"
    script.write_text(textwrap.dedent(WAITS))
    dump = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          check=True, timeout=60).stdout
    (tmp_path / "rank1.txt").write_text(dump)
    (tmp_path / "rank0.txt").write_text("")  # a rank that never answered
    assert stacks.read(tmp_path) == {1: dump}
    assert stacks.where(stacks.read(tmp_path), script) == [
        "rank 1: waits.py:17  faulthandler.dump_traceback(file=sys.stdout, all_threads=True)"]


# It must leave every rank time to reach the line it hangs on: on a busy 2-core machine (make
# test's other lane launching too) importing torch and joining the group took over 10 s. Rank 1
# sleeps rather than spins, so the long wait costs the rest of the suite no CPU.
HANG_TIMEOUT_S = 30


def _hang_report(make_script, launcher, **kwargs) -> tuple[LaunchTimeout, float]:
    script = make_script("hangs.py", HANGS)
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as caught:
        launcher(script, timeout=HANG_TIMEOUT_S, stream=False, **kwargs)
    return caught.value, time.monotonic() - start - HANG_TIMEOUT_S


# Two nodes in the long sweep: the dumps are written and read by the same code, and each variant
# spends its 30 s waiting for the timeout.
@pytest.mark.parametrize("where", ["one node",
                                   pytest.param("two nodes", marks=pytest.mark.sweep)])
def test_a_hung_launch_names_each_ranks_line(make_script, where):
    if where == "one node":
        error, late = _hang_report(make_script, launch, nproc_per_node=2)
    else:
        error, late = _hang_report(make_script, launch_nodes, nnodes=2, nproc_per_node=1)
    message = str(error)
    assert "rank 0: hangs.py:9  dist.all_reduce(t)" in message, message
    assert "rank 1: hangs.py:11  while True:" in message or \
        "rank 1: hangs.py:12  time.sleep(0.1)" in message, message
    assert sorted(error.result.stacks) == [0, 1]
    assert (error.result.run_dir / "stacks" / "rank0.txt").is_file()
    assert late < 15, f"the report came {late:.1f} s after the timeout"
