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
rendezvous host, the port taken from the job's number, the ``mpiexec`` options (MPICH's CPU
binding and the one-GPU-per-process wrapper included), the script's rank mapping, the
``torchrun`` command. Not run here: ssh between machines, what only a PBS server checks at
``qsub``, GPUs (the wrapper's ``CUDA_VISIBLE_DEVICES`` is checked, not used), and HPE Cray's
``mpiexec`` (PALS), whose form is checked as text and its GPU wrapper run by ``bash``.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import command_line

from ddp_lib import cluster

HOSTS = ["localhost", "pbs-node2"]  # the first one must resolve: the group meets there
JOB_TIMEOUT_S = 180

# The lessons' way: the rank where the launcher put it, torchrun's first (under
# `mpiexec --ppn 1 torchrun` the workers see MPICH's variables too, naming the machine).
JOB = """
import os
import sys
import time

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
                 f"master={os.environ['MASTER_ADDR']} sum={total.item():g} "
                 f"cores={len(os.sched_getaffinity(0))} "
                 f"gpus={os.environ.get('CUDA_VISIBLE_DEVICES', 'all')}\\n")
sys.stdout.flush()
time.sleep(0.2)  # torch 2.4-2.7 can hang in destroy: pytorch/pytorch#154976
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


def free_job_number() -> tuple[int, int]:
    """A job number whose port, as the job file takes it (20000 + number % 10000), is free."""
    for number in random.sample(range(1_000_000, 1_010_000), 100):
        port = 20000 + number % 10000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return number, port
    raise RuntimeError("no free port in 20000-29999")


def run_as_pbs(batch: Path, workdir: Path, per_node: int,
               job_number: int) -> subprocess.CompletedProcess:
    """Run ``batch`` as PBS would on the job's first node; no process of it may outlive it."""
    nodefile = workdir / "nodefile"
    nodefile.write_text("".join(f"{host}\n" * per_node for host in HOSTS))
    job_id = f"{job_number}.pbs-test"
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


def submit(workdir: Path, launcher: str, per_node: int,
           **options) -> tuple[int, subprocess.CompletedProcess]:
    """Write the test's job and its PBS script on two machines, run it as PBS would; it must
    succeed. The port is the job file's own (from the job's number) unless ``port`` is given.
    Returns the port and the run."""
    (workdir / "job.py").write_text(JOB)
    job_number, port = free_job_number()
    port = options.get("port", port)
    batch = workdir / "job.pbs"
    batch.write_text(cluster.pbs_script("job.py", nodes=2, cpus_per_node=2,
                                        nproc_per_node=per_node, launcher=launcher,
                                        **{"gpus_per_node": 0, **options}))
    done = run_as_pbs(batch, workdir, per_node=per_node, job_number=job_number)
    assert done.returncode == 0, done.stdout + done.stderr
    return port, done


@pytest.mark.sweep
def test_mpiexec_form_starts_every_process_and_the_script_maps_its_rank(workdir: Path):
    port, done = submit(workdir, "mpiexec", per_node=2)

    assert f"store at localhost:{port}" in done.stdout  # the port from the job's number
    ranks = reports(done.stdout)
    assert sorted(ranks) == [0, 1, 2, 3], done.stdout + done.stderr
    for rank, report in ranks.items():
        # --ppn 2 over the node file's machines, in its order: 0 and 1 on the first.
        assert report["host"] == HOSTS[rank // 2] and report["local"] == str(rank % 2)
        assert report["world"] == "4" and report["sum"] == "10"
        assert report["master"] == "localhost"  # the node file's first line
        # No mpi named: no binding, no GPU wrapper; the variable stays as the job found it
        # (make compat sets it empty).
        assert report["gpus"] == os.environ.get("CUDA_VISIBLE_DEVICES", "all")


@pytest.mark.sweep
def test_mpiexec_form_for_mpich_binds_each_process_to_its_cores_and_its_gpu(workdir: Path):
    # 2 GPUs named per machine (there are none here: CUDA_VISIBLE_DEVICES is only read back),
    # 2 CPU cores per machine for 2 processes: one core each.
    port, done = submit(workdir, "mpiexec", per_node=2, gpus_per_node=2, mpi="mpich")
    assert f"store at localhost:{port}" in done.stdout
    text = (workdir / "job.pbs").read_text()
    assert "mpiexec -n 4 --ppn 2 -bind-to core:1 \\\n" in text

    ranks = reports(done.stdout)
    assert sorted(ranks) == [0, 1, 2, 3], done.stdout + done.stderr
    for rank, report in ranks.items():
        assert report["cores"] == "1", f"rank {rank} may run on {report['cores']} cores"
        assert report["gpus"] == report["local"] == str(rank % 2)
        assert report["sum"] == "10"


@pytest.mark.sweep
def test_a_given_port_is_the_stores(workdir: Path):
    _, given = free_job_number()
    port, done = submit(workdir, "mpiexec", per_node=1, port=given)
    assert port == given and f"store at localhost:{given}" in done.stdout
    assert "JOB_NUMBER" not in (workdir / "job.pbs").read_text()
    assert sorted(reports(done.stdout)) == [0, 1]


def test_the_pals_form_binds_with_its_depth_and_gives_each_process_its_gpu(tmp_path: Path):
    """HPE Cray's mpiexec is not here: its line is checked as text, its GPU wrapper run."""
    text = cluster.pbs_script("train.py", nodes=2, gpus_per_node=4, cpus_per_node=32,
                              mpi="pals")
    (line,) = [line for line in text.replace("\\\n", " ").splitlines()
               if line.startswith("mpiexec ")]
    words = shlex.split(line)
    assert words[:9] == ["mpiexec", "-n", "8", "--ppn", "4", "--cpu-bind", "depth", "--depth",
                         "8"]  # ALCF's Polaris: 32 cores, 4 ranks of depth 8
    wrapper, command = words[9:13], words[13:]
    assert command == ["python", "train.py"]
    # In reverse, as ALCF's set_affinity_gpu_polaris.sh: local rank 0 on GPU 3, 3 on GPU 0.
    for local_rank, gpu in (("0", "3"), ("1", "2"), ("3", "0"), ("4", "3")):
        seen = subprocess.run([*wrapper, "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"'],
                              env={**os.environ, "PMI_LOCAL_RANK": local_rank},
                              capture_output=True, text=True, check=True)
        assert seen.stdout.strip() == gpu, local_rank
    path = tmp_path / "job.pbs"
    path.write_text(text)
    subprocess.run(["bash", "-n", str(path)], check=True, capture_output=True)


@pytest.mark.sweep
def test_torchrun_form_starts_one_agent_per_node(workdir: Path):
    port, done = submit(workdir, "torchrun", per_node=1)  # the rendezvous at the job's port

    assert f"rendezvous at localhost:{port}" in done.stdout
    ranks = reports(done.stdout)
    assert sorted(ranks) == [0, 1], done.stdout + done.stderr
    # One agent per machine: torchrun's ranks, not mpiexec's, one worker on each machine.
    assert {report["host"] for report in ranks.values()} == set(HOSTS)
    for report in ranks.values():
        assert report["world"] == "2" and report["sum"] == "3" and report["local"] == "0"
