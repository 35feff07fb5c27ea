"""One device rule: every lesson script chooses its backend and GPU alike, and agrees with
``ddp_lib.hardware.plan``.

The scripts keep the rule inline, because it is lesson text: NCCL where the process sees a GPU,
each process on a GPU of its own (``cuda:LOCAL_RANK`` when it sees all of its machine's GPUs,
``cuda:0`` when a launcher such as ``srun --gpus-per-task`` or ``mpiexec -gpus-per-proc`` let
it see only its own), a clear error when there are several GPUs but fewer than processes, Gloo
on the CPU where there is none, and ``DDP_BACKEND`` over all of it. These tests take the rule out
of every script the notebooks write, run the script's own lines on fake machines, and check the
four cases a rank meets, then that a launch from a notebook (``plan``, with the ``DDP_BACKEND``
it passes) makes every script run as planned.
"""

from __future__ import annotations

import json
import re
import textwrap
import types
from pathlib import Path

import pytest

from ddp_lib import hardware

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
START = re.compile(r"^([ ]*)gpus = torch\.cuda\.device_count\(\)", re.MULTILINE)
OLD_RULE = re.compile(r"device_count\(\) >= ")


def rules() -> list[tuple[str, str]]:
    """(notebook, the script's lines from ``gpus = ...`` to the end of ``if backend == ...``)."""
    found = []
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] != "code" or 'os.environ.get("DDP_BACKEND")' not in source:
                continue
            match = START.search(source)
            assert match, f"{path.name}: a backend rule not of the course's form:\n{source[:300]}"
            base, block, in_if = match.group(1), [], False
            for line in source[match.start():].splitlines():
                at_base = line.startswith(base) and not line[len(base):].startswith(" ")
                if "init_process_group" in line or (in_if and line.strip() and at_base
                                                    and not line.strip().startswith("else")):
                    break  # the rule is the lines before the if/else on the backend, and it
                in_if = in_if or line.strip().startswith("if backend ==")
                block.append(line)
            found.append((path.name, textwrap.dedent("\n".join(block))))
    return found


class FakeTorch:
    """What the rule touches of torch: the GPU count, devices, seeds and threads."""

    def __init__(self, gpus: int):
        self.cuda = types.SimpleNamespace(device_count=lambda: gpus,
                                          set_device=lambda device: None)
        self.manual_seed = self.set_num_threads = lambda *_: None

    @staticmethod
    def device(kind: str, index: int | None = None) -> tuple:
        return (kind, index)


def run_rule(block: str, *, gpus: int, local_rank: int, local_world_size: int,
             env: dict[str, str] | None = None) -> tuple[str, tuple]:
    """The script's own lines on a machine where this process sees ``gpus`` GPUs."""
    environ = {"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_world_size),
               **(env or {})}
    namespace = {"os": types.SimpleNamespace(environ=environ), "torch": FakeTorch(gpus),
                 "local_rank": local_rank, "local_world_size": local_world_size,
                 "threads_per_process": lambda: 1,
                 "args": types.SimpleNamespace(threads=None, seed=0)}
    exec(block, namespace)  # the script's own words
    return namespace["backend"], namespace.get("device", ("cpu", None))


RULES = rules()


def test_every_script_that_chooses_a_backend_is_found():
    names = {name for name, _ in RULES}
    assert {"00_setup.ipynb", "05_ddp.ipynb", "10_hpc_launchers.ipynb"} <= names, names
    for path in NOTEBOOKS:
        assert not OLD_RULE.search(path.read_text(encoding="utf-8")) or path.name in {
            "04_init_methods.ipynb", "09_hangs.ipynb"}, f"{path.name}: the old rule"


@pytest.mark.parametrize(("notebook", "block"), RULES)
def test_all_gpus_visible_each_rank_takes_its_local_rank(notebook, block):
    for local_rank in range(4):
        backend, device = run_rule(block, gpus=4, local_rank=local_rank, local_world_size=4)
        assert backend == "nccl"
        if "device = torch.device" in block:
            assert device == ("cuda", local_rank), notebook


@pytest.mark.parametrize(("notebook", "block"), RULES)
def test_one_gpu_per_rank_takes_cuda_0_and_never_falls_back_to_gloo(notebook, block):
    # srun --gpus-per-task=1, mpiexec -gpus-per-proc 1 or a CUDA_VISIBLE_DEVICES per rank: each
    # of the 4 processes of the machine sees one GPU, its own.
    for local_rank in range(4):
        backend, device = run_rule(block, gpus=1, local_rank=local_rank, local_world_size=4)
        assert backend == "nccl", f"{notebook}: a rank with its own GPU trained on the CPU"
        if "device = torch.device" in block:
            assert device == ("cuda", 0), notebook


@pytest.mark.parametrize(("notebook", "block"), RULES)
def test_fewer_gpus_than_ranks_stops_with_what_to_do(notebook, block):
    if "device = torch.device" not in block:
        pytest.skip("this script picks a backend but no device")
    with pytest.raises(RuntimeError, match=r"^2 GPUs for more processes: one per GPU, "
                       r"or DDP_BACKEND=gloo$"):
        run_rule(block, gpus=2, local_rank=3, local_world_size=4)
    backend, device = run_rule(block, gpus=2, local_rank=3, local_world_size=4,
                               env={"DDP_BACKEND": "gloo"})
    assert (backend, device[0]) == ("gloo", "cpu")


@pytest.mark.parametrize(("notebook", "block"), RULES)
def test_no_gpu_trains_on_the_cpu_with_gloo(notebook, block):
    backend, device = run_rule(block, gpus=0, local_rank=1, local_world_size=2)
    assert (backend, device[0]) == ("gloo", "cpu")


def machine(gpus: int) -> hardware.Hardware:
    return hardware.Hardware(cpu_cores=8, cpu_model="test", cuda_gpus=gpus,
                             gpu_names=("GPU",) * gpus, nccl_available=True,
                             gloo_available=True, torch_version="test", cuda_version="13.0")


@pytest.mark.parametrize(("notebook", "block"), RULES)
def test_a_course_launch_runs_every_script_as_planned(notebook, block):
    """The kernel sees all of the machine's GPUs; plan() may choose Gloo where the script alone
    would pick NCCL (2 processes, 1 GPU), and then passes DDP_BACKEND, printed with the command."""
    for gpus in range(4):
        for processes in range(1, 5):
            planned = hardware.plan(processes, hw=machine(gpus))
            for local_rank in range(processes):
                backend, device = run_rule(block, gpus=gpus, local_rank=local_rank,
                                           local_world_size=processes, env=planned.env())
                assert backend == planned.backend, (notebook, gpus, processes)
                if "device = torch.device" in block:
                    assert device[0] == planned.device_type, (notebook, gpus, processes)


def test_plan_passes_the_backend_only_where_the_scripts_would_choose_otherwise():
    assert hardware.plan(2, hw=machine(0)).env() == {}
    assert hardware.plan(2, hw=machine(2)).env() == {}
    assert hardware.plan(2, hw=machine(1)).env() == {"DDP_BACKEND": "gloo"}
    assert hardware.plan(2, "gloo", hw=machine(0)).env() == {"DDP_BACKEND": "gloo"}
