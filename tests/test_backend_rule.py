"""One backend rule: the lessons' scripts and ``ddp_lib.hardware.plan`` choose alike.

The scripts keep their short inline rule, because it is lesson text: NCCL when this machine has
a GPU for each of its processes, Gloo otherwise, unless ``DDP_BACKEND`` says. ``hardware.plan``,
which the notebooks print and ``launch`` checks, decides with the same rule. These tests take the
rule out of every script the notebooks write and evaluate it against ``plan`` for every machine
from no GPU to several, so that neither can change alone.
"""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest

from ddp_lib import hardware

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
RULE = re.compile(r'backend = os\.environ\.get\("DDP_BACKEND"\) or \((.*?)\)\n', re.DOTALL)
SCRIPT_RULE = re.compile(r'backend = os\.environ\.get\("DDP_BACKEND"[^\n]*')


def rules() -> list[tuple[str, str]]:
    """(notebook, expression) for every backend rule in a script cell of the series."""
    found = []
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] != "code":
                continue
            for line in SCRIPT_RULE.findall(source):
                match = RULE.search(source, source.index(line))
                assert match, f"{path.name}: a backend rule not of the course's form:\n{line}"
                found.append((path.name, match.group(1).strip()))
    return found


def machine(gpus: int) -> hardware.Hardware:
    return hardware.Hardware(cpu_cores=8, cpu_model="test", cuda_gpus=gpus,
                             gpu_names=("GPU",) * gpus, nccl_available=True,
                             gloo_available=True, torch_version="test", cuda_version="13.0")


def test_every_script_that_chooses_a_backend_is_found():
    names = {name for name, _ in rules()}
    assert {"00_setup.ipynb", "05_ddp.ipynb"} <= names, names


@pytest.mark.parametrize(("notebook", "expression"), rules())
def test_the_scripts_rule_agrees_with_hardware_plan(notebook, expression):
    for gpus in range(4):
        for local_processes in range(1, 5):
            namespace = {
                "os": types.SimpleNamespace(environ={"LOCAL_WORLD_SIZE": str(local_processes)}),
                "torch": types.SimpleNamespace(
                    cuda=types.SimpleNamespace(device_count=lambda gpus=gpus: gpus)),
                "local_world_size": local_processes,
            }
            chosen = eval(expression, namespace)  # the script's own words
            planned = hardware.plan(local_processes, hw=machine(gpus)).backend
            assert chosen == planned, (notebook, gpus, local_processes)
