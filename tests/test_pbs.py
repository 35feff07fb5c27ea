"""The generated PBS script, run as PBS runs it on the job's first node, with MPICH's mpiexec.

There is no PBS server here. The test does what PBS does before it starts a batch script: it
writes the node file (one line per MPI process, the first machine first) and sets
``PBS_NODEFILE``, ``PBS_JOBID``, ``PBS_O_WORKDIR`` and ``PBS_ENVIRONMENT=PBS_BATCH``; the
environment is the course's, as ``#PBS -V`` hands it over, so ``mpiexec`` is the one the
project installs. The script then runs with ``bash`` from another folder. MPICH's ``mpiexec``
sees ``PBS_ENVIRONMENT`` and reads the machines from ``$PBS_NODEFILE`` itself; the node file
names two, ``localhost`` and ``pbs-node2``, and ``HYDRA_LAUNCHER=fork`` makes ``mpiexec`` start
the second machine's processes here instead of through ssh (each machine still gets a proxy
and local ranks of its own). So the whole body runs for real: the node file read, the
rendezvous host, the ``mpiexec`` options, the script's rank mapping, the ``torchrun`` command.
Not run here: ssh between machines, and what only a PBS server checks at ``qsub``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from conftest import command_line
from test_slurm import free_ports

from ddp_lib import cluster

HOSTS = ["localhost", "pbs-node2"]  # the first one must resolve: the group meets there
JOB_TIMEOUT_S = 180

# The lessons' way: the rank where the launcher put it, torchrun's first (under
# `mpiexec --ppn 1 torchrun` the workers see MPICH's variables too, naming the machine).
JOB = """
import os
import sys

import torch
import torch.distributed as dist


def ranks() -> tuple[int, int, int]:
    \"\"\"Rank, world size and local rank, from torchrun or else from MPICH's mpiexec.\"\"\"
    if "RANK" in os.environ:
        return (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                int(os.environ["LOCAL_RANK"]))
    return (int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"]),
            int(os.environ["MPI_LOCALRANKID"]))


rank, world, local = ranks()
dist.init_process_group("gloo", rank=rank, world_size=world)
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
# One write per line: mpiexec passes on each process's writes as they come, so the two
# writes of a print (the text, then the newline) could interleave with another process's.
sys.stdout.write(f"rank={rank} world={world} local={local} host={os.environ['PMI_HOSTNAME']} "
                 f"master={os.environ['MASTER_ADDR']} sum={total.item():g}\\n")
sys.stdout.flush()
dist.destroy_process_group()
"""


def processes_of(job_id: str) -> list[psutil.Process]:
    """Live processes of the job: every one of them inherits its ``PBS_JOBID``.

    mpiexec starts its proxies and processes in sessions of their own, and a rank's command
    line names only ``job.py``: the environment is what they all share.
    """
    found = []
    for p in psutil.process_iter(["status", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if p.info["status"] != psutil.STATUS_ZOMBIE \
                    and p.environ().get("PBS_JOBID") == job_id:
                found.append(p)
    return found


def run_as_pbs(batch: Path, workdir: Path, per_node: int) -> subprocess.CompletedProcess:
    """Run ``batch`` as PBS would on the job's first node; no process of it may outlive it."""
    nodefile = workdir / "nodefile"
    nodefile.write_text("".join(f"{host}\n" * per_node for host in HOSTS))
    job_id = f"{uuid.uuid4().hex[:8]}.pbs-test"
    env = {**os.environ,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "VIRTUAL_ENV": sys.prefix, "OMP_NUM_THREADS": "1",
           "PBS_ENVIRONMENT": "PBS_BATCH", "PBS_NODEFILE": str(nodefile), "PBS_JOBID": job_id,
           "PBS_JOBNAME": "ddp-test", "PBS_O_WORKDIR": str(workdir),
           "HYDRA_LAUNCHER": "fork"}
    for variable in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "PMI_RANK"):
        env.pop(variable, None)
    try:
        # From / : the script itself must go to the working folder.
        return subprocess.run(["bash", str(batch)], env=env, cwd="/", capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, timeout=JOB_TIMEOUT_S)
    finally:
        deadline = time.monotonic() + 5
        while (left := processes_of(job_id)) and time.monotonic() < deadline:
            time.sleep(0.2)
        described = [command_line(p) for p in left]
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        assert not described, f"processes of the job left behind: {described}"


def reports(output: str) -> dict[int, dict[str, str]]:
    return {int(m.group(1)): dict(pair.split("=") for pair in m.group(2).split())
            for m in re.finditer(r"^rank=(\d+) (.*)$", output, flags=re.MULTILINE)}


def submit(workdir: Path, launcher: str, per_node: int) -> tuple[int, subprocess.CompletedProcess]:
    """Write the test's job and its PBS script on two machines, run it as PBS would; it must
    succeed. Returns the script's port and the run."""
    (workdir / "job.py").write_text(JOB)
    port, = free_ports(1)
    batch = workdir / "job.pbs"
    batch.write_text(cluster.pbs_script("job.py", nodes=2, gpus_per_node=0, cpus_per_node=2,
                                        nproc_per_node=per_node, port=port, launcher=launcher))
    done = run_as_pbs(batch, workdir, per_node=per_node)
    assert done.returncode == 0, done.stdout + done.stderr
    return port, done


@pytest.mark.sweep
def test_mpiexec_form_starts_every_process_and_the_script_maps_its_rank(workdir: Path):
    port, done = submit(workdir, "mpiexec", per_node=2)

    assert f"store at localhost:{port}" in done.stdout
    ranks = reports(done.stdout)
    assert sorted(ranks) == [0, 1, 2, 3], done.stdout + done.stderr
    for rank, report in ranks.items():
        # --ppn 2 over the node file's machines, in its order: 0 and 1 on the first.
        assert report["host"] == HOSTS[rank // 2] and report["local"] == str(rank % 2)
        assert report["world"] == "4" and report["sum"] == "10"
        assert report["master"] == "localhost"  # the node file's first line


@pytest.mark.sweep
def test_torchrun_form_starts_one_agent_per_node(workdir: Path):
    port, done = submit(workdir, "torchrun", per_node=1)

    assert f"rendezvous at localhost:{port}" in done.stdout
    ranks = reports(done.stdout)
    assert sorted(ranks) == [0, 1], done.stdout + done.stderr
    # One agent per machine: torchrun's ranks, not mpiexec's, one worker on each machine.
    assert {report["host"] for report in ranks.values()} == set(HOSTS)
    for report in ranks.values():
        assert report["world"] == "2" and report["sum"] == "3" and report["local"] == "0"
