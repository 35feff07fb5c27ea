"""What every process of a launch runs first (``ddp_lib/worker_site/sitecustomize.py``), besides
the stack dumps (``test_stacks.py``) and torchrun's error files of scripts that import torch
(``test_launch.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from ddp_lib import launch

WORKER_SITE = Path(__file__).resolve().parents[1] / "ddp_lib" / "worker_site"

# An object only a reference cycle keeps, left for Python's last garbage collection to finalize.
LEFT_IN_A_CYCLE = """
    import gc
    import os

    gc.disable()  # nothing collects it before the exit


    class Noted:
        def __del__(self):
            os.write(1, b"finalized by the last collection\\n")


    cycle = Noted()
    cycle.itself = cycle
    del cycle
    print("done", flush=True)
"""


def test_the_last_garbage_collection_is_skipped(tmp_path):
    script = tmp_path / "cycle.py"
    script.write_text(textwrap.dedent(LEFT_IN_A_CYCLE))

    def run(pythonpath: str) -> str:
        env = {**os.environ, "PYTHONPATH": pythonpath}
        return subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                              text=True, check=True, timeout=60).stdout

    assert run("") == "done\nfinalized by the last collection\n"  # Python's own exit
    assert run(str(WORKER_SITE)) == "done\n"


IMPORTS = """
    import sys

    print("before:", "torch" in sys.modules, flush=True)
    if "--torch" in sys.argv:
        import torch  # noqa: F401
    print("after:", sorted(m for m in sys.modules if m in ("torch", "torch.distributed.nn")))
"""


def test_torch_distributed_nn_comes_with_torch_in_a_launch_worker(tmp_path):
    """In a worker of a ddp_lib launch, ``import torch`` brings ``torch.distributed.nn`` with
    it (before ``init_process_group`` can run); a script without torch does not import it."""
    script = tmp_path / "imports.py"
    script.write_text(textwrap.dedent(IMPORTS))

    def run(*args: str, **env: str) -> str:
        env = {**os.environ, "PYTHONPATH": str(WORKER_SITE), **env}
        return subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True,
                              text=True, check=True, timeout=120).stdout

    worker = {"DDP_WORKSHOP_STACKS": str(tmp_path / "stacks"), "RANK": "0", "LOCAL_RANK": "0"}
    assert run("--torch", **worker) == "before: False\nafter: ['torch', 'torch.distributed.nn']\n"
    assert run(**worker) == "before: False\nafter: []\n"  # no torch, no cost
    assert run("--torch", DDP_WORKSHOP_STACKS="") == "before: False\nafter: ['torch']\n"


DESTROY = """
    import torch
    import torch.distributed as dist

    print("wrapped:", hasattr(dist.destroy_process_group, "__wrapped__"))
"""


def test_destroy_waits_for_gloo_only_where_the_destructor_holds_the_gil(tmp_path):
    """Before torch 2.8, ``destroy_process_group`` first lets Gloo's threads take the GIL (the
    deadlock in docs/compatibility.md); from 2.8 on it is torch's own function."""
    import torch

    script = tmp_path / "destroy.py"
    script.write_text(textwrap.dedent(DESTROY))
    env = {**os.environ, "PYTHONPATH": str(WORKER_SITE),
           "DDP_WORKSHOP_STACKS": str(tmp_path / "stacks"), "RANK": "0", "LOCAL_RANK": "0"}
    printed = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                             text=True, check=True, timeout=120).stdout
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    assert printed == f"wrapped: {(major, minor) < (2, 8)}\n"
    versions = ["2.4.1+cu121", "2.7.1", "2.8.0", "2.14.1"]
    probe = ("import sitecustomize as s; "
             f"print([s._destructor_holds_the_gil(v) for v in {versions}])")
    printed = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                             text=True, check=True, timeout=60).stdout
    assert printed == "[True, True, False, False]\n"


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


def test_a_script_that_fails_before_importing_torch_is_not_made_to_import_it(tmp_path):
    """Its traceback is printed as always; torch's error file would cost importing torch."""
    script = tmp_path / "fails.py"
    script.write_text("import sys\nraise ValueError('no torch here')\n")
    error_file = tmp_path / "error.json"
    env = {**os.environ, "PYTHONPATH": str(WORKER_SITE), "TORCHELASTIC_ERROR_FILE": str(error_file),
           "DDP_WORKSHOP_STACKS": str(tmp_path / "stacks"), "RANK": "0", "LOCAL_RANK": "0"}
    failed = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=60)
    assert failed.returncode == 1 and "ValueError: no torch here" in failed.stderr
    assert not error_file.exists()
