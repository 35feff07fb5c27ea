"""What every process of a launch runs first (``ddp_lib/launching/worker_site/``), besides the
stack dumps (``test_stacks.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from ddp_lib import launch

WORKER_SITE = Path(__file__).resolve().parents[1] / "ddp_lib" / "launching" / "worker_site"

# What a rank can see of its interpreter: an object only a reference cycle keeps, finalized by
# Python's last garbage collection; which torch modules an import of torch brings; whether
# destroy_process_group is torch's own function; the exit status.
PROBE = """
    import gc
    import os
    import sys

    import torch
    import torch.distributed as dist

    gc.disable()  # nothing collects it before the exit


    class Noted:
        def __del__(self):
            os.write(1, b"finalized by the last collection\\n")


    cycle = Noted()
    cycle.itself = cycle
    del cycle
    print("torch.distributed.nn:", "torch.distributed.nn" in sys.modules)
    print("destroy_process_group wrapped:", hasattr(dist.destroy_process_group, "__wrapped__"))
    print("done", flush=True)
"""


def test_a_launch_worker_behaves_as_a_plain_python_process(tmp_path):
    """The worker start-up only observes: the probe prints the same with it as without it."""
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(PROBE))

    def run(**env: str) -> str:
        return subprocess.run([sys.executable, str(script)], env={**os.environ, **env},
                              capture_output=True, text=True, check=True, timeout=120).stdout

    plain = run(PYTHONPATH="")
    assert plain.endswith("done\nfinalized by the last collection\n")
    assert run(PYTHONPATH=str(WORKER_SITE), DDP_WORKSHOP_STACKS=str(tmp_path / "stacks"),
               RANK="0", LOCAL_RANK="0") == plain


def test_a_sitecustomize_that_was_there_still_runs(make_script, workdir, monkeypatch):
    # A site's or a distribution's own sitecustomize, on the path before the launch.
    site = workdir / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['SITE_RAN'] = 'yes'\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [
        str(site), os.environ.get("PYTHONPATH")])))
    script = make_script("site.py", "import os; print('site', os.environ.get('SITE_RAN'))\n")
    result = launch(script, nproc_per_node=1, stream=False, timeout=60)
    assert "site yes" in result.output(0)


def test_the_start_up_writes_no_error_file(tmp_path):
    """A script without ``@record`` that raises leaves torchrun's error file unwritten, as under
    plain torchrun: only its traceback says what it raised."""
    script = tmp_path / "fails.py"
    script.write_text("import torch\nraise ValueError('no @record here')\n")
    error_file = tmp_path / "error.json"
    env = {**os.environ, "PYTHONPATH": str(WORKER_SITE), "TORCHELASTIC_ERROR_FILE": str(error_file),
           "DDP_WORKSHOP_STACKS": str(tmp_path / "stacks"), "RANK": "0", "LOCAL_RANK": "0"}
    failed = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=120)
    assert failed.returncode == 1 and "ValueError: no @record here" in failed.stderr
    assert not error_file.exists()
