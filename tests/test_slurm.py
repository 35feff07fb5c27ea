"""The generated Slurm script, submitted to a real Slurm with two nodes on this machine.

The test starts its own munged, slurmctld and two slurmd (nodes ``n1`` and ``n2``), with every
file in a temporary folder (``SLURM_CONF`` points there), submits
``ddp_lib.cluster.slurm_script`` with ``sbatch --wait`` and reads the job's log. The job is
submitted as a learner would, from a shell with the course's environment activated and no
``PYTHONPATH``: its script imports ``ddp_lib`` as the lessons' scripts do, from the project that
``make setup`` installed into the clone's own environment, ``.venv``. Each slurmd
runs as a machine of its own would: its own host name and an /etc/hosts naming both nodes
(UTS and mount namespaces), so ``$HEAD_NODE`` resolves exactly as on a cluster. Slurm is
installed from the distribution's packages when missing (root and apt-get needed); elsewhere the
test is skipped and says why.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from conftest import command_line, processes_mentioning, wait_until_gone

from ddp_lib import cluster, scripts
from ddp_lib.launching import metrics
from ddp_lib.launching.launcher import free_ports

PACKAGES = ["slurm-wlm", "munge"]
TOOLS = ["munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "unshare"]
# Each node has an address of its own on the loopback network (127.0.0.0/8), as machines have.
NODES = {"n1": "127.0.0.2", "n2": "127.0.0.3"}
JOB_TIMEOUT_S = 240
NODE_CPUS = min(2, len(os.sched_getaffinity(0)))  # each node: this machine's cores, up to 2
ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "ddp_lib"  # this clone's
CLONE_ENV = LIBRARY.parent / ".venv"  # make setup's: the shared packages and this clone


def activated(slurm: dict[str, str]) -> dict[str, str]:
    """Slurm's environment as after ``source .venv/bin/activate``, as a learner submits."""
    if not (CLONE_ENV / "bin" / "python").exists():
        pytest.skip(f"no {CLONE_ENV}: run make setup first")
    return {**slurm, "PATH": f"{CLONE_ENV / 'bin'}{os.pathsep}{slurm['PATH']}",
            "VIRTUAL_ENV": str(CLONE_ENV)}
LESSON_10 = Path(__file__).resolve().parents[1] / "notebooks" / "10_hpc_launchers.ipynb"

JOB = """
import os
import socket
import time

import torch
import torch.distributed as dist

import ddp_lib

dist.init_process_group("gloo")
rank = dist.get_rank()
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
# One write per line: with PYTHONUNBUFFERED, print writes its text and its newline apart,
# and another rank's line can land between them.
print(f"rank={rank} world={dist.get_world_size()} host={socket.gethostname()} "
      f"master={os.environ['MASTER_ADDR']} sum={total.item():g} "
      f"pythonpath={'PYTHONPATH' in os.environ} "
      f"ddp_lib={os.path.dirname(os.path.realpath(ddp_lib.__file__))}" + "\\n", end="", flush=True)
dist.barrier()
time.sleep(0.2)  # torch 2.4-2.7 can hang in destroy: pytorch/pytorch#154976
dist.destroy_process_group()
"""

# Start the rest of the command line as a machine of its own: its host name, its /etc/hosts.
AS_HOST = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'


def install_slurm() -> str | None:
    """Install Slurm and munge if missing; the reason they are not there, or ``None``."""
    if all(shutil.which(tool) for tool in TOOLS):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return (f"Slurm is not installed ({', '.join(t for t in TOOLS if not shutil.which(t))} "
                "missing) and installing it needs root and apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    try:
        done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode:  # the package lists may be missing or stale
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env,
                           timeout=600)
            done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
    except subprocess.TimeoutExpired:
        return "apt-get did not install Slurm within 10 minutes"
    if done.returncode:
        return f"apt-get could not install Slurm: {done.stderr.strip()[-500:]}"
    return None


def slurm_conf(folder: Path, ctld_port: int, node_ports: list[int], munge_socket: Path) -> str:
    """A one-machine cluster: no systemd, no cgroups, no accounting, every file in ``folder``.

    As clusters schedule today: by cores (``select/cons_tres`` with ``CR_Core``), each task
    bound to the cores it was given (``task/affinity``); every node has this machine's cores.
    """
    nodes = "\n".join(f"NodeName={name} NodeHostname={name} NodeAddr={address} Port={port} "
                      f"CPUs={NODE_CPUS} State=UNKNOWN"
                      for (name, address), port in zip(NODES.items(), node_ports, strict=True))
    return f"""\
ClusterName=ddpworkshop
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
{nodes}
PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


class Daemons:
    """The processes the fixture started; all of them are stopped at the end, whatever happens."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.procs: list[subprocess.Popen] = []

    def start(self, *command: str, log: Path) -> subprocess.Popen:
        with open(log, "ab") as out:
            proc = subprocess.Popen(command, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    """A running Slurm cluster of two nodes; yields the environment its clients need."""
    reason = install_slurm()
    if reason:
        pytest.skip(reason)
    if os.geteuid() != 0:
        pytest.skip("the Slurm daemons run as root here (SlurmUser=root); run the tests as root")
    folder = tmp_path_factory.mktemp("slurm")
    (folder / "state").mkdir()
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    munge_socket = folder / "munge.socket"
    ctld_port, *node_ports = free_ports(1 + len(NODES))
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, ctld_port, node_ports, munge_socket))
    hosts = folder / "hosts"
    hosts.write_text(Path("/etc/hosts").read_text()
                     + "".join(f"{address} {name}\n" for name, address in NODES.items()))
    # The clients (sbatch, scontrol) and the job get this environment, as on a login node.
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons = Daemons(env)
    try:
        daemons.start("munged", "--foreground", "--force", f"--socket={munge_socket}",
                      f"--key-file={key}", f"--pid-file={folder}/munged.pid",
                      f"--log-file={folder}/munged.log", f"--seed-file={folder}/munged.seed",
                      log=folder / "munged.out")
        _wait_for(munge_socket.exists, 20, "munged did not create its socket", folder)
        daemons.start("slurmctld", "-D", "-i", log=folder / "slurmctld.out")
        for name in NODES:
            daemons.start("unshare", "--uts", "--mount", "sh", "-c", AS_HOST, "sh", name,
                          str(hosts), "slurmd", "-D", "-N", name, log=folder / f"{name}.out")

        def nodes_idle() -> bool:
            done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env,
                                  capture_output=True, text=True, timeout=10)
            return done.stdout.split() == [word for name in NODES for word in (name, "idle")]

        _wait_for(nodes_idle, 60, "the nodes did not become idle", folder)
        yield env
    finally:
        daemons.stop()
        left = wait_until_gone(str(folder), within=5)
        described = [command_line(proc) for proc in left]  # slurmstepd of an unfinished job
        for proc in left:
            with contextlib.suppress(psutil.Error):  # it ended meanwhile
                proc.kill()
        assert not described, described


def _wait_for(ready, within: float, what: str, folder: Path) -> None:
    deadline = time.monotonic() + within
    while not ready():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {log.name}\n{log.read_text()[-1500:]}"
                             for log in sorted(folder.glob("*.log")) + sorted(folder.glob("*.out")))
            pytest.fail(f"{what} within {within:g} s. Logs:\n{logs}")
        time.sleep(0.5)


def submit(env: dict[str, str], batch: Path, job_name: str) -> tuple[int, str]:
    """``sbatch --wait`` the job (cancelled if the wait fails); its id and its log, which it must
    end without error to return."""
    try:
        done = subprocess.run(["sbatch", "--wait", str(batch)], env=env, capture_output=True,
                              text=True, timeout=JOB_TIMEOUT_S)
    finally:
        subprocess.run(["scancel", f"--name={job_name}"], env=env, capture_output=True,
                       timeout=30)
    job_id = re.search(r"Submitted batch job (\d+)", done.stdout)
    assert job_id, done.stdout + done.stderr
    log = (batch.parent / f"{job_name}-{job_id.group(1)}.out").read_text()
    assert done.returncode == 0, log
    return int(job_id.group(1)), log


def rank_reports(log: str) -> dict[int, dict[str, str]]:
    """rank -> the ``key=value`` words of the line ``rank=N ...`` that rank printed."""
    return {int(m.group(1)): dict(pair.split("=") for pair in m.group(2).split())
            for m in re.finditer(r"^rank=(\d+) (.*)$", log, flags=re.MULTILINE)}


# In the long sweep (make test-browser): installing and starting Slurm, then a two-node job, takes
# most of a minute, and make test already checks the generated script's text (test_cluster.py).
@pytest.mark.sweep
def test_generated_script_runs_on_two_slurm_nodes(slurm: dict[str, str], tmp_path: Path):
    (tmp_path / "job.py").write_text(JOB)
    rendezvous_port, = free_ports(1)  # both nodes share this machine's network
    batch = tmp_path / "job.sbatch"
    batch.write_text(cluster.slurm_script("job.py", nodes=2, gpus_per_node=0, cpus_per_task=1,
                                          nproc_per_node=1, job_name="ddp-test",
                                          time_limit="5", port=rendezvous_port,
                                          workdir=str(tmp_path)))
    # As a user does: activate the clone's environment, then submit; sbatch hands this
    # environment to every node. Nothing points Python at this clone: the job finds ddp_lib
    # where make setup installed it.
    env = {**activated(slurm), "OMP_NUM_THREADS": "1"}
    for variable in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME"):
        env.pop(variable, None)
    _, log = submit(env, batch, "ddp-test")

    assert f"rendezvous at n1:{rendezvous_port}" in log
    reports = rank_reports(log)
    assert sorted(reports) == [0, 1], log
    assert {report["host"] for report in reports.values()} == set(NODES)  # one rank per node
    for report in reports.values():
        assert report["world"] == "2" and report["sum"] == "3"
        assert report["master"] == "n1"  # the first node of the allocation
        assert report["pythonpath"] == "False"
        assert report["ddp_lib"] == str(LIBRARY), (
            f"the environment's ddp_lib is {report['ddp_lib']}, not this clone's: "
            "`make setup` here installs this clone into it")
    assert not processes_mentioning(str(tmp_path / "job.py"))


# Every rank says which cores it may run on and how many threads it took: the course's rule, as
# every lesson script calls it, and what its torchrun (the parent) was given.
AFFINITY_JOB = """
import os
import socket
import time

import torch
import torch.distributed as dist

from course_helpers import backend_and_device

backend, device = backend_and_device()
dist.init_process_group(backend)
# One write per line: with PYTHONUNBUFFERED, print writes its text and its newline apart,
# and another rank's line can land between them.
print(f"rank={os.environ['RANK']} host={socket.gethostname()} backend={backend} "
      f"cpus={len(os.sched_getaffinity(0))} "
      f"torchrun_cpus={len(os.sched_getaffinity(os.getppid()))} "
      f"threads={torch.get_num_threads()}" + "\\n", end="", flush=True)
dist.barrier()
time.sleep(0.2)  # torch 2.4-2.7 can hang in destroy: pytorch/pytorch#154976
dist.destroy_process_group()
"""


@pytest.mark.sweep
def test_each_nodes_torchrun_and_its_ranks_get_the_cpus_the_job_asked_for(slurm: dict[str, str],
                                                                          tmp_path: Path):
    """Steps that take only what they ask (SLURM_EXACT=1, as sites that bind by default do),
    task affinity, cores as the unit: on Slurm 22.05 a bare ``srun torchrun`` would give torchrun
    and both its ranks one core; the generated job asks srun for the job's cores again."""
    if NODE_CPUS < 2:
        pytest.skip("needs two cores to tell a node's two from one")
    (tmp_path / "affinity.py").write_text(AFFINITY_JOB)
    batch = tmp_path / "affinity.sbatch"
    batch.write_text(cluster.slurm_script("affinity.py", nodes=2, gpus_per_node=0,
                                          cpus_per_task=NODE_CPUS, nproc_per_node=2,
                                          job_name="ddp-affinity", time_limit="5",
                                          workdir=str(tmp_path), dataset=None))
    env = {**activated(slurm), "SLURM_EXACT": "1"}
    for variable in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"):
        env.pop(variable, None)
    job_id, log = submit(env, batch, "ddp-affinity")
    assert f"rendezvous at n1:{20000 + job_id % 10000}" in log, log  # from the job's number
    reports = rank_reports(log)
    assert sorted(reports) == [0, 1, 2, 3], log  # $SLURM_JOB_NUM_NODES machines x 2
    assert {report["host"] for report in reports.values()} == set(NODES)
    for report in reports.values():
        assert report["backend"] == "gloo"
        assert report["torchrun_cpus"] == report["cpus"] == str(NODE_CPUS), log  # the job's ask
        assert report["threads"] == str(NODE_CPUS // 2), log  # shared by the node's 2 ranks


# Lesson 10's script under srun and under MPICH's mpiexec in a Slurm job, with no torchrun: the
# batch script sets MASTER_ADDR to the job's first node, as the lesson's srun job does.
ANYWHERE_BATCH = """\
#!/bin/bash
#SBATCH --job-name=ddp-anywhere
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --time=5
#SBATCH --output={log}
set -euo pipefail
cd {workdir}
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT={ports[0]}
echo "batch SLURM_PROCID=$SLURM_PROCID SLURM_LOCALID=$SLURM_LOCALID"
srun --cpus-per-task="$SLURM_CPUS_PER_TASK" python train_anywhere.py --epochs 1 \\
    --train-samples 64 --test-samples 32 --batch-size 16 --checkpoint {workdir}/anywhere.pt
srun --mpi=pmi2 python probe.py
MASTER_PORT={ports[1]} mpiexec -n 4 python probe.py
"""

# What a process of the job sees, and what the lesson's function makes of it: one write per
# line, as mpiexec passes on each write as it comes.
PROBE = """\
import json
import os
import sys

import train_anywhere  # the lesson's script, next to this file

SEEN = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID",
        "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE")
seen = {name: os.environ[name] for name in SEEN if name in os.environ}
launcher = train_anywhere.set_torchrun_variables()
mapped = [int(os.environ[name]) for name in train_anywhere.LAUNCHERS["torchrun"]]
sys.stdout.write("probe " + json.dumps({"seen": seen, "launcher": launcher, "mapped": mapped})
                 + "\\n")
"""


def lesson_10_environment(name: str) -> dict[str, str]:
    """The environment a solution cell of lesson 10 gives a process, as ``name = dict(...)``."""
    for cell in nbformat.read(LESSON_10, as_version=4).cells:
        if "solution" not in cell.metadata.get("tags", []):
            continue
        for node in ast.parse(cell.source).body:
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == name:
                return {keyword.arg: ast.literal_eval(keyword.value)
                        for keyword in node.value.keywords}
    raise LookupError(f"{LESSON_10.name} assigns no {name}")


def probes(log: str, launcher: str) -> dict[int, dict]:
    """The probes whose function found ``launcher``, by the rank it gave them."""
    found = [json.loads(line.removeprefix("probe ")) for line in log.splitlines()
             if line.startswith("probe ")]
    return {probe["mapped"][0]: probe for probe in found if probe["launcher"] == launcher}


@pytest.mark.sweep
def test_lesson_10_script_runs_unchanged_under_srun_and_mpiexec(slurm: dict[str, str],
                                                               tmp_path: Path):
    scripts.from_notebook(LESSON_10, "train_anywhere.py", directory=tmp_path, quiet=True)
    (tmp_path / "probe.py").write_text(PROBE)
    log, metrics_file = tmp_path / "anywhere.out", tmp_path / "metrics.jsonl"
    batch = tmp_path / "anywhere.sbatch"
    batch.write_text(ANYWHERE_BATCH.format(log=log, workdir=tmp_path, ports=free_ports(2)))
    env = {**activated(slurm), "OMP_NUM_THREADS": "1",
           "DDP_WORKSHOP_DATASET": "synthetic", metrics.ENV_VAR: str(metrics_file)}
    # torchrun's variables, left in this environment, would win over srun's and mpiexec's.
    for variable in ("MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "DDP_BACKEND", "RANK",
                     "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(variable, None)
    try:
        done = subprocess.run(["sbatch", "--wait", str(batch)], env=env, capture_output=True,
                              text=True, timeout=JOB_TIMEOUT_S)
    finally:
        subprocess.run(["scancel", "--name=ddp-anywhere"], env=env, capture_output=True,
                       timeout=30)
    text = log.read_text() if log.exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + text

    # The batch script itself: Slurm's variables name the batch step, not a rank.
    assert "batch SLURM_PROCID=0 SLURM_LOCALID=0" in text
    # srun, unchanged script: each rank read Slurm's variables, and DDP trained one model.
    records = metrics.read(metrics_file)
    started = sorted((r["rank"], r["launcher"], r["value"]) for r in records
                     if r["name"] == "local_rank")
    assert started == [(0, "Slurm", 0), (1, "Slurm", 0)], text  # one task on each node
    weights = {r["rank"]: r["sha256"] for r in records if r["name"] == "weights_sum"}
    assert sorted(weights) == [0, 1] and len(set(weights.values())) == 1, text
    # srun --mpi=pmi2 adds PMI_RANK and PMI_SIZE, no local rank: Slurm's variables still win.
    pmi2 = probes(text, "Slurm")
    assert sorted(pmi2) == [0, 1] and pmi2[1]["mapped"] == [1, 2, 0, 1], text
    assert pmi2[1]["seen"] == lesson_10_environment("environment"), text  # exercise 1's
    # mpiexec in a Slurm job: Hydra starts one helper per node with srun, so every rank also
    # sees SLURM_PROCID, its node's index; MPICH's variables come first and name the rank.
    ranks = probes(text, "MPICH")
    assert sorted(ranks) == [0, 1, 2, 3], text
    assert [ranks[r]["mapped"] for r in range(4)] == [[r, 4, r // 2, 2] for r in range(4)], text
    assert ranks[3]["seen"] == lesson_10_environment("mpiexec_in_slurm"), text  # exercise 2's
    assert not processes_mentioning(str(tmp_path))


def job_state(env: dict[str, str], job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields, e.g. ``JobState`` and ``Restarts``."""
    shown = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True,
                           text=True, timeout=30).stdout
    return dict(re.findall(r"(\w+)=(\S*)", shown))


def run_to_the_end(env: dict[str, str], batch: Path, *, notice_when: Path | None = None,
                   within: float = JOB_TIMEOUT_S) -> str:
    """Submit ``batch``; once ``notice_when`` exists, give the batch shell Slurm's notice (USR1,
    what ``--signal=B:USR1@N`` sends N seconds before the limit); wait for the job's end."""
    submitted = subprocess.run(["sbatch", "--parsable", str(batch)], env=env, check=True,
                               capture_output=True, text=True, timeout=30)
    job_id = submitted.stdout.strip().split(";")[0]
    deadline, noticed = time.monotonic() + within, notice_when is None
    try:
        while time.monotonic() < deadline:
            if not noticed and notice_when.exists():
                subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], env=env,
                               check=True, capture_output=True, timeout=30)
                noticed = True
            state = job_state(env, job_id)
            if state.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
                return job_id
            if state.get("JobState") == "PENDING" and state.get("Restarts") == "1":
                # A requeued job may start again only after its begin time (here Slurm 22.05
                # allocated it 2 min 39 s after the requeue): the test lets it start at once.
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"],
                               env=env, capture_output=True, timeout=30)
            time.sleep(0.2)
        pytest.fail(f"job {job_id} did not end within {within:g} s: {job_state(env, job_id)}")
    finally:
        subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=30)


@pytest.mark.sweep
def test_a_job_given_notice_checkpoints_requeues_and_ends_as_if_uninterrupted(
        slurm: dict[str, str], tmp_path: Path):
    """The generated job with ``notice_s``: given Slurm's notice after its first checkpoint, its
    ranks stop after the next one, the job requeues itself, and the second run resumes there and
    ends with the weights of a job that was never interrupted."""
    scripts.from_notebook(ROOT / "notebooks" / "05_ddp.ipynb", "train_ddp_resume.py",
                          directory=tmp_path, quiet=True)
    fingerprints = {}
    for name in ("interrupted", "uninterrupted"):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(tmp_path / "train_ddp_resume.py", folder)
        batch = folder / "job.sbatch"
        batch.write_text(cluster.slurm_script(
            "train_ddp_resume.py", nodes=2, gpus_per_node=0, cpus_per_task=NODE_CPUS,
            nproc_per_node=1, job_name=f"ddp-{name}", time_limit="10", workdir=str(folder),
            dataset="synthetic", notice_s=60,
            args=["--epochs", 12, "--train-samples", 1024, "--test-samples", 128,
                  "--batch-size", 32, "--checkpoint", "resume.pt"]))
        env = {**activated(slurm), metrics.ENV_VAR: str(folder / "metrics.jsonl")}
        for variable in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"):
            env.pop(variable, None)
        job_id = run_to_the_end(env, batch, notice_when=(folder / "resume.pt")
                                if name == "interrupted" else None)
        state = job_state(env, job_id)
        log = (folder / f"ddp-{name}-{job_id}.out").read_text()
        assert state["JobState"] == "COMPLETED", log
        records = metrics.read(folder / "metrics.jsonl")
        fingerprints[name] = {r["rank"]: r["sha256"] for r in records
                              if r["name"] == "weights_sum"}
        if name == "interrupted":
            assert state["Restarts"] == "1", state  # requeued once, by its own trap
            assert log.count(f"job {job_id} on ") == 2, log  # the two runs, in one log
            resumed = re.findall(r"resumed from resume\.pt after epoch (\d+)", log)
            assert len(resumed) == 1 and int(resumed[0]) < 11, log  # stopped early, went on
            epochs = [r["step"] for r in records if r["name"] == "train_loss" and r["rank"] == 0]
            assert epochs == list(range(12)), epochs  # every epoch once, across the two runs
    assert fingerprints["interrupted"] == fingerprints["uninterrupted"], fingerprints
    assert len(set(fingerprints["uninterrupted"].values())) == 1


# The hpc track's capstone (docs/instructors.md, "Capstones"): the take-home kit's own job file,
# submitted from the kit's folder with sbatch, after the changes the instructor's checklist names
# for a partition without GPUs and an offline machine; its log then passes the checklist.
CPU_PARTITION = [  # (what the kit's file says, what the checklist has the instructor write)
    (re.compile(r"^#SBATCH --gpus-per-node=.*\n", re.M), ""),
    (re.compile(r"--cpus-per-task=32"), f"--cpus-per-task={NODE_CPUS}"),
    (re.compile(r"^export DDP_BACKEND=nccl$", re.M), "export DDP_BACKEND=gloo"),
    (re.compile(r"^export DDP_WORKSHOP_DATASET=cifar10$", re.M),
     "export DDP_WORKSHOP_DATASET=synthetic"),
    (re.compile(r"--nproc-per-node=gpu"), "--nproc-per-node=1"),
    (re.compile(r"(train_ddp\.py --epochs 5 .*)$", re.M),
     r"\1 --train-samples 1024 --test-samples 256"),
]


@pytest.mark.sweep
def test_the_take_home_kits_job_passes_the_capstone_checklist(slurm: dict[str, str],
                                                             tmp_path: Path, capsys):
    from workshop import capstone, take_home

    kit = take_home.build(tmp_path / "take-home")
    batch = kit / "train_ddp.sbatch"
    text = batch.read_text()
    for kit_says, instructor_writes in CPU_PARTITION:
        text, changed = kit_says.subn(instructor_writes, text)
        assert changed == 1, f"the kit's job file no longer has {kit_says.pattern}"
    batch.write_text(text)
    env = {**activated(slurm), "OMP_NUM_THREADS": "1"}
    for variable in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT", "DDP_WORKSHOP_DATA_DIR"):
        env.pop(variable, None)
    # On the login node, before submitting, as the job file's header says.
    subprocess.run(["python", "-c", "import course_helpers as c; c.prepare_cifar10()"],
                   cwd=kit, env={**env, "DDP_WORKSHOP_DATASET": "synthetic"}, check=True,
                   timeout=300)
    try:
        done = subprocess.run(["sbatch", "--wait", batch.name], cwd=kit, env=env,
                              capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    finally:
        subprocess.run(["scancel", "--name=ddp-workshop"], env=env, capture_output=True,
                       timeout=30)
    job_id = re.search(r"Submitted batch job (\d+)", done.stdout)
    assert job_id, done.stdout + done.stderr
    log = kit / f"ddp-workshop-{job_id[1]}.out"
    assert capstone.joblog(log, epochs=5) == 0, capsys.readouterr().out + log.read_text()
    assert done.returncode == 0
