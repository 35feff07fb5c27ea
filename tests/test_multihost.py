"""A 2-node gloo job across two real network hosts made on this machine.

Each "host" is a Linux network namespace with its own address on one end of a veth pair, its
own host name (a UTS namespace) and its own /etc/hosts (a mount namespace): the only way from
one to the other is the veth link, so a job that finishes has talked across it. Each host runs
exactly the command ``ddp_lib.cluster.host_commands`` gives for it (``ssh_commands`` runs the
same one remotely). Creating namespaces needs root; elsewhere the test is skipped.

The same two hosts run an ``mpiexec`` job, started on the first host as on a cluster's head
node: MPICH's mpiexec reads a host file and starts its proxy on the other host with ssh, here
``ip netns exec`` behind a script that Hydra's ``-launcher-exec`` calls as it would call ssh.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import processes_mentioning

import course_helpers as helpers
from ddp_lib import cluster
from workshop import take_home

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 180

JOB = """
import os
import socket
import time

import torch
import torch.distributed as dist

import psutil

dist.init_process_group("gloo")
rank = dist.get_rank()
master = os.environ["MASTER_ADDR"]
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
# The ports of this rank's connections to the other host (not to its own agent's store).
link = sorted({f"{c.laddr.port}-{c.raddr.port}" for c in psutil.Process().net_connections("tcp")
               if c.raddr and c.raddr.ip != c.laddr.ip})
# One write per line: with PYTHONUNBUFFERED, print writes its text and its newline apart,
# and another rank's line can land between them.
print(f"rank={rank} world={dist.get_world_size()} host={socket.gethostname()} "
      f"master={master} master_ip={socket.gethostbyname(master)} sum={total.item():g} "
      f"ports={','.join(link)} rdzv_port={os.environ['MASTER_PORT']}" + "\\n", end="", flush=True)
dist.barrier()
time.sleep(0.2)  # torch 2.4-2.7 can hang in destroy: pytorch/pytorch#154976
dist.destroy_process_group()
"""

# Run the rest of the command line as a machine of its own would: its own host name, and an
# /etc/hosts that names both machines by their addresses on the link.
AS_HOST = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'

MPI_JOB = """
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

# mpiexec's variables, as lesson 10's script reads them; MASTER_ADDR names the first host.
rank, world = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
master = os.environ["MASTER_ADDR"]
# One write per line: mpiexec passes each rank's writes on as they come, unlabelled here.
sys.stdout.write(f"rank={rank} world={world} host={socket.gethostname()} master={master} "
                 f"master_ip={socket.gethostbyname(master)} sum={total.item():g}\\n")
sys.stdout.flush()
time.sleep(0.2)  # torch 2.4-2.7 can hang in destroy: pytorch/pytorch#154976
dist.destroy_process_group()
"""

# ssh as Hydra's ssh launcher calls it (options, the host, then the command line to run there),
# reaching the host's namespace instead of a remote machine.
FAKE_SSH = """#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
case $host in
%(cases)s
*) echo "no such host: $host" >&2; exit 255;;
esac
exec ip netns exec "$namespace" unshare --uts --mount \\
    sh -c 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec sh -c "$*"' \\
    sh "$host" %(hosts_file)s "$@"
"""


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts(workdir: Path):
    """Two namespaces joined by a veth pair; yields [(namespace, host name, address)]."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add); run the tests as root")
    missing = [tool for tool in ("ip", "unshare") if not shutil.which(tool)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (Debian: iproute2, util-linux)")
    tag = f"ddpw{os.getpid()}"  # unique per test process, so parallel runs never collide
    subnet = f"10.{77 + os.getpid() % 100}.{os.getpid() % 250}"  # seen only inside them
    hosts = [(f"{tag}-a", "ddp-node1", f"{subnet}.1"), (f"{tag}-b", "ddp-node2", f"{subnet}.2")]
    created = []
    try:
        for namespace, _, _ in hosts:
            done = run("ip", "netns", "add", namespace)
            if done.returncode:
                pytest.skip(f"cannot create a network namespace here: {done.stderr.strip()}")
            created.append(namespace)
        (ns_a, _, addr_a), (ns_b, _, addr_b) = hosts
        steps = [
            ("ip", "link", "add", "veth0", "netns", ns_a, "type", "veth",
             "peer", "name", "veth0", "netns", ns_b),
            ("ip", "-n", ns_a, "addr", "add", f"{addr_a}/24", "dev", "veth0"),
            ("ip", "-n", ns_b, "addr", "add", f"{addr_b}/24", "dev", "veth0"),
        ]
        for namespace in (ns_a, ns_b):
            steps += [("ip", "-n", namespace, "link", "set", "lo", "up"),
                      ("ip", "-n", namespace, "link", "set", "veth0", "up")]
        for step in steps:
            done = run(*step)
            assert done.returncode == 0, f"{' '.join(step)} failed: {done.stderr}"
        yield hosts
    finally:
        for namespace in created:
            _kill_processes_in(namespace)
            run("ip", "netns", "del", namespace)
        left = run("ip", "netns", "list").stdout
        assert not any(namespace in left for namespace in created), left


def _kill_processes_in(namespace: str) -> None:
    pids = run("ip", "netns", "pids", namespace).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass


def run_on_hosts(two_hosts, workdir: Path, commands, *, own_disk: Path | None = None,
                 read_only: Path | None = None, envs: list[dict] | None = None) -> list[str]:
    """Run each host's command in its namespace, as that machine; return their outputs.

    ``own_disk``: a folder that each host sees as a disk of its own (another folder bound over
    it in the host's mount namespace), as a pod without a shared volume does. ``read_only``: a
    folder the hosts cannot write to, as a ConfigMap's. ``envs``: each host's own variables.
    """
    hosts_file = workdir / "hosts"
    hosts_file.write_text("127.0.0.1 localhost\n"
                          + "".join(f"{address} {name}\n" for _, name, address in two_hosts))
    env = {**os.environ,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for variable in ("MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME"):
        env.pop(variable, None)  # nothing from outside may steer the job
    nodes = []
    try:
        for i, ((namespace, name, _), command) in enumerate(zip(two_hosts, commands, strict=True)):
            mounts = ""
            if own_disk is not None:
                (workdir / f"disk-{name}").mkdir()
                mounts += f"mount --bind {workdir / f'disk-{name}'} {own_disk} && "
            if read_only is not None:
                mounts += f"mount --bind {read_only} {read_only} && " \
                          f"mount -o remount,ro,bind {read_only} && "
            nodes.append(subprocess.Popen(
                ["ip", "netns", "exec", namespace, "unshare", "--uts", "--mount",
                 "sh", "-c", mounts + AS_HOST, "sh", name, str(hosts_file), *command],
                cwd=workdir, env={**env, **(envs[i] if envs else {})}, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, start_new_session=True))
        outputs = [node.communicate(timeout=TIMEOUT_S)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
        for namespace, _, _ in two_hosts:
            _kill_processes_in(namespace)
    for node, output in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, output
    return outputs


def test_two_hosts_rendezvous_and_all_reduce_across_the_link(two_hosts, workdir: Path):
    (workdir / "job.py").write_text(JOB)
    names = [name for _, name, _ in two_hosts]
    commands = cluster.host_commands("job.py", hosts=names, nproc_per_node=1)
    outputs = run_on_hosts(two_hosts, workdir, commands)
    reports = {}
    for output in outputs:
        for match in re.finditer(r"^rank=(\d+) (.*)$", output, flags=re.MULTILINE):
            reports[int(match.group(1))] = dict(pair.split("=") for pair in match.group(2).split())
    master_address = two_hosts[0][2]
    assert sorted(reports) == [0, 1], outputs
    assert {reports[rank]["host"] for rank in reports} == set(names)  # one rank per host
    for report in reports.values():
        assert report["world"] == "2" and report["sum"] == "3"
        # Every rank reached the master by its name on the link, never the loopback address.
        assert report["master"] == names[0]
        assert report["master_ip"] == master_address
    # Gloo's pairs connect the ranks on ports that they take from the system, beside the
    # store's: a firewall between machines (or pods) that lets only the rendezvous port through
    # stops the job after the rendezvous. Both ranks see the same connections.
    pairs = [{tuple(sorted(map(int, pair.split("-")))) for pair in report["ports"].split(",")}
             for report in reports.values()]
    store = int(reports[0]["rdzv_port"])
    assert pairs[0] & pairs[1] and any(store not in pair for pair in pairs[0] & pairs[1]), pairs
    assert not processes_mentioning(str(workdir / "job.py"))


def test_each_host_prepares_the_data_on_its_own_disk(two_hosts, workdir: Path):
    """Lesson 05's script on two machines that share no disk, as two pods without a shared
    volume: each machine's local rank 0 prepares the data there, and both train."""
    kit = take_home.build(workdir / "kit")
    (kit / "data").mkdir()
    names = [name for _, name, _ in two_hosts]
    commands = cluster.host_commands(
        str(kit / "train_ddp.py"), hosts=names, nproc_per_node=1,
        args=["--epochs", 1, "--train-samples", 256, "--test-samples", 128,
              "--checkpoint", workdir / "ckpt.pt"])
    outputs = run_on_hosts(two_hosts, workdir, commands, own_disk=kit / "data",
                           envs=[{"DDP_WORKSHOP_DATASET": "synthetic"}] * 2)
    for name, output in zip(names, outputs, strict=True):
        assert "Data: the SYNTHETIC stand-in" in output, output  # prepared there, by that host
        assert helpers.synthetic_is_whole(workdir / f"disk-{name}"), output
    assert not any((kit / "data").iterdir())  # nothing went to the disk the hosts share
    assert (workdir / "ckpt.pt").exists()


@pytest.mark.sweep
def test_mpiexec_starts_ranks_on_both_hosts_through_ssh(two_hosts, workdir: Path):
    (workdir / "mpi_job.py").write_text(MPI_JOB)
    hosts_file = workdir / "hosts"
    hosts_file.write_text("127.0.0.1 localhost\n"
                          + "".join(f"{address} {name}\n" for _, name, address in two_hosts))
    fake_ssh = workdir / "ssh"
    fake_ssh.write_text(FAKE_SSH % {
        "cases": "\n".join(f"{name}) namespace={namespace};;" for namespace, name, _ in two_hosts),
        "hosts_file": hosts_file})
    fake_ssh.chmod(0o755)
    machines = workdir / "machines"  # MPICH's host file: host:processes
    machines.write_text("".join(f"{name}:1\n" for _, name, _ in two_hosts))
    (head_namespace, head, _), _ = two_hosts
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "MASTER_ADDR": head, "MASTER_PORT": "29500"}
    command = [str(mpiexec), "-f", str(machines), "-n", "2", "-launcher", "ssh",
               "-launcher-exec", str(fake_ssh), sys.executable, str(workdir / "mpi_job.py")]
    try:
        done = subprocess.run(
            ["ip", "netns", "exec", head_namespace, "unshare", "--uts", "--mount",
             "sh", "-c", AS_HOST, "sh", head, str(hosts_file), *command],
            cwd=workdir, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    finally:
        for namespace, _, _ in two_hosts:
            _kill_processes_in(namespace)
    assert done.returncode == 0, done.stdout + done.stderr
    reports = {int(match.group(1)): dict(pair.split("=") for pair in match.group(2).split())
               for match in re.finditer(r"^rank=(\d+) (.*)$", done.stdout, flags=re.MULTILINE)}
    assert sorted(reports) == [0, 1], done.stdout
    assert {report["host"] for report in reports.values()} == {name for _, name, _ in two_hosts}
    for report in reports.values():
        assert report["world"] == "2" and report["sum"] == "3"
        assert report["master_ip"] == two_hosts[0][2]  # reached across the link
    assert not processes_mentioning(str(workdir / "mpi_job.py"))


def test_the_take_home_trainjob_runs_in_pods_that_share_no_disk(two_hosts, workdir: Path):
    """The take-home TrainJob's own command and variables, in two pods made from the two hosts:
    the scripts in a read-only folder laid out as the kubelet lays out a ConfigMap, each pod's
    data folder its own disk, the checkpoint on the claim, and torchrun's options in the PET_
    variables that Kubeflow Trainer's torch runtime sets. On CPUs: one process per pod, Gloo,
    and the generated data set, where the job asks for 4 GPUs, NCCL and CIFAR-10."""
    kit = take_home.build(workdir / "kit")
    claim, trainjob = yaml.safe_load_all((kit / "train_ddp.trainjob.yaml").read_text())
    trainer = trainjob["spec"]["trainer"]
    pod = workdir / "pod"  # the pods' /workspace; the claim's volume is workdir / "claim"

    def in_pod(word: str) -> str:
        return word.replace("/workspace", str(pod)).replace("/checkpoints", str(workdir / "claim"))

    configmap = pod / "scripts"
    (configmap / "..2026_11_29").mkdir(parents=True)
    for name in ("train_ddp.py", "course_helpers.py"):
        shutil.copy(kit / name, configmap / "..2026_11_29" / name)
        (configmap / name).symlink_to(Path("..data") / name)
    (configmap / "..data").symlink_to("..2026_11_29")
    (workdir / "claim").mkdir()
    env = {var["name"]: in_pod(var["value"]) for var in trainer["env"]}
    assert set(env) == {"DDP_WORKSHOP_DATA_DIR", "DDP_BACKEND", "DDP_WORKSHOP_DATASET"}
    env |= {"DDP_BACKEND": "gloo", "DDP_WORKSHOP_DATASET": "synthetic"}
    data = Path(env["DDP_WORKSHOP_DATA_DIR"])
    data.mkdir()
    names = [name for _, name, _ in two_hosts]
    envs = [{**env, "PET_NNODES": str(trainer["numNodes"]), "PET_NPROC_PER_NODE": "1",
             "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": names[0], "PET_MASTER_PORT": "29500"}
            for rank in range(2)]
    command = [in_pod(word) for word in trainer["command"]]
    command += ["--epochs", "1", "--train-samples", "256", "--test-samples", "128"]
    outputs = run_on_hosts(two_hosts, workdir, [command] * 2, own_disk=data,
                           read_only=configmap, envs=envs)
    for name, output in zip(names, outputs, strict=True):
        assert helpers.synthetic_is_whole(workdir / f"disk-{name}"), output
    assert not any(data.iterdir())
    assert (workdir / "claim" / "train_ddp.pt").exists(), outputs
    assert claim["metadata"]["name"] == trainjob["spec"]["runtimePatches"][0][
        "trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["spec"]["volumes"][2]["persistentVolumeClaim"]["claimName"]
