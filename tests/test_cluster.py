"""ddp_lib.cluster: one torchrun command in Slurm and PBS scripts, Kubernetes jobs and SSH."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from ddp_lib import cluster

DATA = Path(__file__).parent / "data"
SCHEMA = yaml.safe_load((DATA / "pytorchjob_schema.yaml").read_text())
TRAINJOB_SCHEMA = yaml.safe_load((DATA / "trainjob_schema.yaml").read_text())
ARGS = ["--epochs", 3, "--lr", 0.1]


def srun_line(script_text: str) -> list[str]:
    """The words of the ``srun`` line, as bash will split them (variables left unexpanded)."""
    joined = script_text.replace("\\\n", " ")
    (line,) = [line for line in joined.splitlines() if line.startswith("srun ")]
    return shlex.split(line)


def slurm_command(script_text: str) -> list[str]:
    """The torchrun command that ``srun`` starts on every node."""
    words = srun_line(script_text)
    return words[words.index("torchrun"):]


def pbs_directives(script_text: str) -> list[str]:
    return re.findall(r"^#PBS (.+)$", script_text, flags=re.MULTILINE)


def pbs_command(script_text: str) -> list[str]:
    """The words of the ``mpiexec`` line, as bash will split them (variables left unexpanded)."""
    joined = script_text.replace("\\\n", " ")
    (line,) = [line for line in joined.splitlines() if line.startswith("mpiexec ")]
    return shlex.split(line)


def manifest_command(manifest: dict, replica: str) -> list[str]:
    (container,) = manifest["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"][
        "containers"]
    return container["command"]


def test_torchrun_command_lists_every_option():
    command = cluster.torchrun_command("train.py", nnodes=2, nproc_per_node=4,
                                       rdzv_endpoint="$HEAD_NODE:29500", args=ARGS)
    assert command == ["torchrun", "--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                       "--rdzv-endpoint=$HEAD_NODE:29500", "--rdzv-id=ddp-workshop",
                       "train.py", "--epochs", "3", "--lr", "0.1"]  # defaults left out
    gpu = cluster.torchrun_command("t.py", nnodes=1, nproc_per_node="gpu",
                                   rdzv_endpoint="$(MASTER_ADDR):$(MASTER_PORT)", max_restarts=3)
    assert "--nproc-per-node=gpu" in gpu and "--max-restarts=3" in gpu


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"script": "train"}, "Python file"),
    ({"script": "my train.py"}, "spaces"),
    ({"nnodes": 0}, "nnodes must be an integer >= 1"),
    ({"nnodes": True}, "nnodes"),
    ({"nproc_per_node": 0}, "nproc_per_node"),
    ({"nproc_per_node": "many"}, "nproc_per_node"),
    ({"rdzv_endpoint": "node1"}, "host:port"),
    ({"rdzv_endpoint": "node1:http"}, "host:port"),
    ({"rdzv_endpoint": "node1:70000"}, "port must be"),
    ({"rdzv_endpoint": "two words:29500"}, "host:port"),
    ({"rdzv_id": "my job"}, "rdzv_id"),
    ({"max_restarts": -1}, "max_restarts"),
    ({"args": "--epochs 3"}, "list of arguments"),
    ({"args": [None]}, "a string, a number or a path"),
])
def test_torchrun_command_rejects_bad_arguments(kwargs, message):
    given = {"script": "train.py", "nnodes": 2, "nproc_per_node": 2,
             "rdzv_endpoint": "node1:29500", **kwargs}
    script = given.pop("script")
    with pytest.raises(ValueError, match=message):
        cluster.torchrun_command(script, **given)


def test_slurm_script_asks_for_one_torchrun_per_node_and_passes_bash_syntax(tmp_path):
    text = cluster.slurm_script("train.py", nodes=2, gpus_per_node=4, cpus_per_task=16,
                                args=ARGS, partition="gpu", workdir="/shared/course", port=29400)
    options = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, flags=re.MULTILINE))
    assert options == {"job-name": "ddp-workshop", "nodes": "2", "ntasks-per-node": "1",
                       "gpus-per-node": "4", "cpus-per-task": "16", "time": "00:30:00",
                       "partition": "gpu", "chdir": "/shared/course", "output": "%x-%j.out"}
    assert 'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    # Each size written once, in the #SBATCH lines: torchrun takes them from the allocation.
    assert slurm_command(text) == cluster.torchrun_command(
        "train.py", nnodes="$SLURM_JOB_NUM_NODES", nproc_per_node="gpu",
        rdzv_endpoint="$HEAD_NODE:29400", rdzv_id="$SLURM_JOB_ID", args=ARGS)
    # srun asks for the CPUs again: Slurm 22.05 to 23.02 do not pass sbatch's on to a step.
    assert srun_line(text)[:2] == ["srun", "--cpus-per-task=$SLURM_CPUS_PER_TASK"]
    # Nothing node-specific is exported; only what makes a mistake fail loudly.
    assert re.findall(r"^\s*export (.*)$", text, flags=re.MULTILINE) == [
        "DDP_BACKEND=nccl", "DDP_WORKSHOP_DATASET=cifar10"]
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    subprocess.run(["bash", "-n", str(path)], check=True, capture_output=True)


def test_slurm_script_for_cpus_leaves_out_gpus_and_defaults_to_one_process():
    text = cluster.slurm_script("train.py", nodes=3, gpus_per_node=0, cpus_per_task=8,
                                dataset="synthetic")
    assert "--gpus-per-node" not in text and "--partition" not in text
    assert "--nproc-per-node=1" in slurm_command(text)
    assert "--nnodes=$SLURM_JOB_NUM_NODES" in slurm_command(text)
    assert re.findall(r"^export (.*)$", text, flags=re.MULTILINE) == [
        "DDP_WORKSHOP_DATASET=synthetic"]  # no GPU asked for, so no NCCL demanded


def test_slurm_script_takes_its_port_from_the_job_unless_given(tmp_path):
    text = cluster.slurm_script("train.py", nodes=2, gpus_per_node=0, cpus_per_task=2)
    assert "--rdzv-endpoint=$HEAD_NODE:$PORT" in slurm_command(text)
    setting = next(line for line in text.splitlines() if line.startswith("PORT="))
    ports = {job: subprocess.run(["bash", "-c", f"{setting}; echo $PORT"], check=True,
                                 env={"SLURM_JOB_ID": str(job)}, capture_output=True,
                                 text=True).stdout.strip() for job in (4711, 4712, 123456)}
    assert ports == {4711: "24711", 4712: "24712", 123456: "23456"}
    assert all(20000 <= int(port) < 32768 for port in ports.values())
    assert "PORT=" not in cluster.slurm_script("train.py", nodes=2, gpus_per_node=0,
                                               cpus_per_task=2, port=29400)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"nodes": 0}, "nodes must be an integer >= 1"),
    ({"gpus_per_node": -1}, "gpus_per_node"),
    ({"cpus_per_task": 0}, "cpus_per_task"),
    ({"nproc_per_node": 8}, "each process needs a GPU"),
    ({"time_limit": "half an hour"}, "time_limit"),
    ({"port": 0}, "port"),
    ({"job_name": "my job"}, "job_name"),
    ({"workdir": "/my folder"}, "workdir"),
    ({"dataset": "imagenet"}, "dataset"),
])
def test_slurm_script_rejects_bad_arguments(kwargs, message):
    given = {"nodes": 2, "gpus_per_node": 4, "cpus_per_task": 8, **kwargs}
    with pytest.raises(ValueError, match=message):
        cluster.slurm_script("train.py", **given)


def test_pbs_script_mpiexec_form_starts_every_process_and_passes_bash_syntax(tmp_path):
    text = cluster.pbs_script("train.py", nodes=2, gpus_per_node=4, cpus_per_node=32,
                              args=ARGS, queue="debug", account="MyProject",
                              filesystems=["home", "eagle"], port=29400)
    assert pbs_directives(text) == [
        "-N ddp-workshop", "-l select=2:ncpus=32:ngpus=4:mpiprocs=4", "-l place=scatter",
        "-l walltime=00:30:00", "-q debug", "-A MyProject", "-l filesystems=home:eagle",
        "-j oe", "-V"]
    assert 'cd "$PBS_O_WORKDIR"' in text
    assert 'HEAD_NODE=$(head -n 1 "$PBS_NODEFILE")' in text
    assert "export MASTER_ADDR=$HEAD_NODE MASTER_PORT=29400" in text
    assert pbs_command(text) == ["mpiexec", "-n", "8", "--ppn", "4", "python", "train.py",
                                 "--epochs", "3", "--lr", "0.1"]
    assert "torchrun" not in text
    path = tmp_path / "job.pbs"
    path.write_text(text)
    subprocess.run(["bash", "-n", str(path)], check=True, capture_output=True)


def test_pbs_script_directives_come_before_the_first_command():
    """qsub reads #PBS lines only up to the first command; comments may come between."""
    text = cluster.pbs_script("train.py", nodes=1, gpus_per_node=0, cpus_per_node=4)
    lines = text.splitlines()
    first_command = next(i for i, line in enumerate(lines)
                         if line.strip() and not line.startswith("#"))
    assert all(not line.startswith("#PBS") for line in lines[first_command:])
    assert len(pbs_directives("\n".join(lines[:first_command]))) == 6


def test_pbs_script_torchrun_form_runs_the_slurm_command_once_per_node(tmp_path):
    text = cluster.pbs_script("train.py", nodes=3, gpus_per_node=4, cpus_per_node=16,
                              args=ARGS, launcher="torchrun", port=29400,
                              workdir="/eagle/course")
    assert "-l select=3:ncpus=16:ngpus=4:mpiprocs=1" in pbs_directives(text)
    assert "cd /eagle/course" in text and "PBS_O_WORKDIR" not in text
    assert 'HEAD_NODE=$(head -n 1 "$PBS_NODEFILE")' in text
    mpiexec, command = pbs_command(text)[:5], pbs_command(text)[5:]
    assert mpiexec == ["mpiexec", "-n", "$NNODES", "--ppn", "1"]
    assert 'NNODES=$(sort -u "$PBS_NODEFILE" | wc -l)' in text  # the sizes from the allocation
    assert command == cluster.torchrun_command(
        "train.py", nnodes="$NNODES", nproc_per_node="gpu", rdzv_endpoint="$HEAD_NODE:29400",
        rdzv_id="$PBS_JOBID", args=ARGS)
    slurm = slurm_command(cluster.slurm_script("train.py", nodes=3, gpus_per_node=4,
                                               cpus_per_task=16, args=ARGS, port=29400))
    # The Slurm script's command; only the scheduler's names for the job and its size differ.
    assert [(p, s) for p, s in zip(command, slurm, strict=True) if p != s] == [
        ("--nnodes=$NNODES", "--nnodes=$SLURM_JOB_NUM_NODES"),
        ("--rdzv-id=$PBS_JOBID", "--rdzv-id=$SLURM_JOB_ID")]
    assert "MASTER_ADDR" not in text  # torchrun sets it for its workers
    path = tmp_path / "job.pbs"
    path.write_text(text)
    subprocess.run(["bash", "-n", str(path)], check=True, capture_output=True)


def test_pbs_script_for_cpus_leaves_out_gpus_queue_and_account():
    text = cluster.pbs_script("train.py", nodes=2, gpus_per_node=0, cpus_per_node=8)
    assert pbs_directives(text) == ["-N ddp-workshop", "-l select=2:ncpus=8:mpiprocs=1",
                                    "-l place=scatter", "-l walltime=00:30:00", "-j oe", "-V"]
    assert pbs_command(text)[:5] == ["mpiexec", "-n", "2", "--ppn", "1"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"nodes": 0}, "nodes must be an integer >= 1"),
    ({"gpus_per_node": -1}, "gpus_per_node"),
    ({"cpus_per_node": 0}, "cpus_per_node"),
    ({"nproc_per_node": 8}, "each process needs a GPU"),
    ({"launcher": "srun"}, "launcher must be one of"),
    ({"max_restarts": 2}, "launcher='torchrun'"),
    ({"launcher": "torchrun", "max_restarts": -1}, "max_restarts"),
    ({"walltime": "half an hour"}, "walltime"),
    ({"walltime": "1-00:00:00"}, "walltime"),  # Slurm's days are not PBS's
    ({"port": 0}, "port"),
    ({"job_name": "my job"}, "job_name"),
    ({"job_name": "-job"}, "job_name"),
    ({"queue": "debug queue"}, "queue"),
    ({"account": ""}, "account"),
    ({"filesystems": "home:eagle"}, "filesystems"),
    ({"filesystems": ["home", "ea gle"]}, "filesystems"),
    ({"workdir": "/my folder"}, "workdir"),
    ({"args": "--epochs 3"}, "list of arguments"),
])
def test_pbs_script_rejects_bad_arguments(kwargs, message):
    given = {"nodes": 2, "gpus_per_node": 4, "cpus_per_node": 8, **kwargs}
    with pytest.raises(ValueError, match=message):
        cluster.pbs_script("train.py", **given)


def test_pbs_script_rejects_a_script_it_cannot_run():
    with pytest.raises(ValueError, match="Python file"):
        cluster.pbs_script("train", nodes=1, gpus_per_node=0, cpus_per_node=1)


def test_pytorchjob_matches_the_schema_and_runs_the_slurm_command():
    manifest = cluster.pytorchjob_manifest("train.py", nodes=3, gpus_per_node=4,
                                           cpus_per_node=16, image="pytorch/pytorch:latest",
                                           args=ARGS, name="resnet", port=29400)
    jsonschema.validate(manifest, SCHEMA)
    specs = manifest["spec"]["pytorchReplicaSpecs"]
    assert (specs["Master"]["replicas"], specs["Worker"]["replicas"]) == (1, 2)
    (container,) = specs["Worker"]["template"]["spec"]["containers"]
    assert container["name"] == "pytorch"
    assert container["resources"]["limits"] == {"cpu": 16, "nvidia.com/gpu": 4}
    assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 29400}]
    slurm = slurm_command(cluster.slurm_script("train.py", nodes=3, gpus_per_node=4,
                                               cpus_per_task=16, args=ARGS, port=29400))
    for replica in ("Master", "Worker"):
        command = manifest_command(manifest, replica)
        # The same command; only the sizes (Slurm's from the allocation, the manifest's its
        # own) and the machine's own name for the rendezvous host and job differ.
        differences = [(k, s) for k, s in zip(command, slurm, strict=True) if k != s]
        assert differences == [
            ("--nnodes=3", "--nnodes=$SLURM_JOB_NUM_NODES"),
            ("--nproc-per-node=4", "--nproc-per-node=gpu"),
            ("--rdzv-endpoint=$(MASTER_ADDR):$(MASTER_PORT)", "--rdzv-endpoint=$HEAD_NODE:29400"),
            ("--rdzv-id=resnet", "--rdzv-id=$SLURM_JOB_ID"),
            ("/workspace/scripts/train.py", "train.py"),  # the ConfigMap's folder in the pod
        ]


def test_single_node_cpu_pytorchjob_has_no_workers_and_no_gpus():
    manifest = cluster.pytorchjob_manifest("train.py", nodes=1, gpus_per_node=0,
                                           cpus_per_node=2, image="python:3.11")
    jsonschema.validate(manifest, SCHEMA)
    assert list(manifest["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    (container,) = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"]
    assert container["resources"]["limits"] == {"cpu": 2}


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
     .update(name="trainer"), "pytorch"),
    (lambda m: m["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
     .update(comand=["torchrun"]), "comand"),
    (lambda m: m["spec"]["pytorchReplicaSpecs"].update(Chief={}), "Chief"),
    (lambda m: m["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2), "1 was expected"),
    (lambda m: m["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas="2"), "'2'"),
    (lambda m: m["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
     ["resources"]["limits"].update(cpu="lots"), "lots"),
])
def test_schema_catches_what_the_operator_would_refuse(change, message):
    """The schema check is real: a misspelled field or a wrong type fails it."""
    manifest = cluster.pytorchjob_manifest("train.py", nodes=2, gpus_per_node=1,
                                           cpus_per_node=4, image="img")
    change(manifest)
    with pytest.raises(jsonschema.ValidationError, match=message):
        jsonschema.validate(manifest, SCHEMA)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"image": ""}, "image"),
    ({"name": "My_Job"}, "name"),
    ({"name": "1st-job"}, "name"),  # its Services' names must start with a letter
    ({"cpus_per_node": 0}, "cpus_per_node"),
    ({"nodes": 0}, "nodes"),
])
def test_pytorchjob_rejects_bad_arguments(kwargs, message):
    given = {"nodes": 2, "gpus_per_node": 1, "cpus_per_node": 4, "image": "img", **kwargs}
    with pytest.raises(ValueError, match=message):
        cluster.pytorchjob_manifest("train.py", **given)


def test_yaml_round_trip_keeps_the_manifest_and_reads_plainly():
    manifest = cluster.pytorchjob_manifest("train.py", nodes=2, gpus_per_node=8,
                                           cpus_per_node=32, image="img", args=ARGS)
    text = cluster.to_yaml(manifest)
    assert yaml.safe_load(text) == manifest
    assert text.startswith("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\n")
    assert "&id" not in text and "*id" not in text  # both replicas written out in full


def test_trainjob_matches_the_schema_and_asks_for_what_the_pytorchjob_does():
    manifest = cluster.trainjob_manifest("train.py", nodes=3, gpus_per_node=4, cpus_per_node=16,
                                         image="pytorch/pytorch:latest", args=ARGS,
                                         name="resnet")
    jsonschema.validate(manifest, TRAINJOB_SCHEMA)
    assert manifest["metadata"] == {"name": "resnet"}
    assert manifest["spec"]["runtimeRef"] == {
        "name": "torch-distributed", "kind": "ClusterTrainingRuntime",
        "apiGroup": "trainer.kubeflow.org"}
    trainer = manifest["spec"]["trainer"]
    assert trainer["command"] == ["torchrun", "/workspace/scripts/train.py",
                                  "--epochs", "3", "--lr", "0.1"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (3, 4)
    pytorchjob = cluster.pytorchjob_manifest("train.py", nodes=3, gpus_per_node=4,
                                             cpus_per_node=16, image="pytorch/pytorch:latest")
    (container,) = pytorchjob["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"]
    assert trainer["resourcesPerNode"] == container["resources"] == {
        "limits": {"cpu": 16, "nvidia.com/gpu": 4}}
    assert trainer["image"] == container["image"]


def test_single_node_cpu_trainjob_runs_one_process_not_one_per_core():
    manifest = cluster.trainjob_manifest("train.py", nodes=1, gpus_per_node=0, cpus_per_node=8,
                                         image="python:3.11", runtime="my-runtime")
    jsonschema.validate(manifest, TRAINJOB_SCHEMA)
    trainer = manifest["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (1, 1)  # not the default "auto"
    assert trainer["resourcesPerNode"] == {"limits": {"cpu": 8}}
    assert manifest["spec"]["runtimeRef"]["name"] == "my-runtime"


def test_torchrun_reads_the_trainjob_options_from_what_the_torch_runtime_sets(monkeypatch):
    """The TrainJob gives torchrun no options: every pod's PET_ variables (set by Trainer's
    torch plugin, here those of the second pod) are torchrun's options."""
    from torch.distributed.run import parse_args

    manifest = cluster.trainjob_manifest("train.py", nodes=2, gpus_per_node=4, cpus_per_node=16,
                                         image="img", args=ARGS, name="resnet")
    trainer = manifest["spec"]["trainer"]
    for name, value in {"PET_NNODES": trainer["numNodes"],
                        "PET_NPROC_PER_NODE": trainer["numProcPerNode"], "PET_NODE_RANK": 1,
                        "PET_MASTER_ADDR": "resnet-node-0-0.resnet",
                        "PET_MASTER_PORT": 29500}.items():
        monkeypatch.setenv(name, str(value))
    program, *words = trainer["command"]
    assert program == "torchrun"
    options = parse_args(words)
    assert (options.nnodes, options.nproc_per_node, int(options.node_rank)) == ("2", "4", 1)
    assert (options.master_addr, int(options.master_port)) == ("resnet-node-0-0.resnet", 29500)
    assert options.rdzv_backend == "static"  # the runtime's rendezvous: master address and rank
    assert (options.training_script, options.training_script_args) == (
        "/workspace/scripts/train.py", ["--epochs", "3", "--lr", "0.1"])


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m["spec"]["trainer"].update(numProcPerNod=4), "'numProcPerNod' was unexpected"),
    (lambda m: m["spec"].update(runtime=m["spec"].pop("runtimeRef")), "'runtime' was unexpected"),
    (lambda m: m["spec"]["runtimeRef"].pop("name"), "'name' is a required property"),
    (lambda m: m["spec"]["trainer"].update(numNodes="2"), "'2' is not of type 'integer'"),
    # The torch runtime's "auto": a TrainJob's numProcPerNode is an integer since Trainer v2.2.
    (lambda m: m["spec"]["trainer"].update(numProcPerNode="auto"), "'auto' is not of type"),
    (lambda m: m["spec"]["trainer"]["resourcesPerNode"]["limits"].update(cpu="lots"), "lots"),
    (lambda m: m["spec"]["trainer"].update(env=[{"name": "PET_NODE_RANK", "value": "0"}]),
     "'PET_NODE_RANK' should not be valid"),
    (lambda m: m["metadata"].update(name="1st-job"), "'1st-job' does not match"),
    (lambda m: m.update(kind="PyTorchJob"), "'PyTorchJob' is not one of"),
])
def test_trainjob_schema_catches_what_trainer_would_refuse(change, message):
    """The schema check is real: a misspelled field or a wrong type fails it."""
    manifest = cluster.trainjob_manifest("train.py", nodes=2, gpus_per_node=1, cpus_per_node=4,
                                         image="img")
    jsonschema.validate(manifest, TRAINJOB_SCHEMA)
    change(manifest)
    with pytest.raises(jsonschema.ValidationError, match=message):
        jsonschema.validate(manifest, TRAINJOB_SCHEMA)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"image": "my image"}, "image"),
    ({"name": "1st-job"}, "name"),
    ({"runtime": "Torch Distributed"}, "runtime"),
    ({"nproc_per_node": 2}, "each process needs a GPU"),
    ({"script": "train"}, "Python file"),
    ({"args": "--epochs 3"}, "list of arguments"),
])
def test_trainjob_rejects_bad_arguments(kwargs, message):
    given = {"script": "train.py", "nodes": 2, "gpus_per_node": 1, "cpus_per_node": 4,
             "image": "img", **kwargs}
    with pytest.raises(ValueError, match=message):
        cluster.trainjob_manifest(given.pop("script"), **given)


def test_trainjob_yaml_keeps_the_manifest():
    manifest = cluster.trainjob_manifest("train.py", nodes=2, gpus_per_node=8, cpus_per_node=32,
                                         image="img", args=ARGS)
    text = cluster.to_yaml(manifest)
    assert yaml.safe_load(text) == manifest
    assert text.startswith("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\n")


def pod_of(manifest: dict) -> tuple[dict, dict]:
    """The pod spec each kind of job gives every node, and its training container there."""
    if manifest["kind"] == "PyTorchJob":
        pod = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    else:
        (patch,) = manifest["spec"]["runtimePatches"]
        (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        assert job["name"] == "node"  # the torch-distributed runtime's replicated job
        pod = job["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


@pytest.mark.parametrize("build", [cluster.pytorchjob_manifest, cluster.trainjob_manifest])
def test_every_pod_has_the_scripts_a_large_shm_and_the_checkpoint_volume(build):
    """Pods share no disk: the scripts come from a ConfigMap, the data goes to each pod's own
    folder (its local rank 0 prepares it), the checkpoint to a claim that outlives the pods."""
    manifest = build("train_ddp.py", nodes=2, gpus_per_node=4, cpus_per_node=16,
                     checkpoint_claim="ddp-checkpoints",
                     args=["--checkpoint", "/checkpoints/train_ddp.pt"])
    jsonschema.validate(manifest, SCHEMA if build is cluster.pytorchjob_manifest
                        else TRAINJOB_SCHEMA)
    pod, container = pod_of(manifest)
    mounted = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes[mounted["/workspace/scripts"]]["configMap"] == {"name": "ddp-workshop-scripts"}
    assert volumes[mounted["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}
    assert volumes[mounted["/checkpoints"]]["persistentVolumeClaim"] == {
        "claimName": "ddp-checkpoints"}
    env = (manifest["spec"]["trainer"] if "trainer" in manifest["spec"] else container)["env"]
    assert {(v["name"], v["value"]) for v in env} == {
        ("DDP_WORKSHOP_DATA_DIR", "/workspace/data"),  # writable, and the pod's own
        ("DDP_BACKEND", "nccl"), ("DDP_WORKSHOP_DATASET", "cifar10")}
    image = (manifest["spec"]["trainer"] if "trainer" in manifest["spec"] else container)["image"]
    assert re.fullmatch(r"pytorch/pytorch:2\.\d+\.\d+-\S+", image)  # pinned, never latest


def test_a_cpu_job_without_a_claim_sets_no_backend_and_mounts_no_checkpoint_volume():
    manifest = cluster.trainjob_manifest("train.py", nodes=1, gpus_per_node=0, cpus_per_node=4,
                                         dataset="synthetic")
    jsonschema.validate(manifest, TRAINJOB_SCHEMA)
    pod, container = pod_of(manifest)
    assert [v["name"] for v in pod["volumes"]] == ["scripts", "dshm"]
    assert {v["name"]: v["value"] for v in manifest["spec"]["trainer"]["env"]} == {
        "DDP_WORKSHOP_DATA_DIR": "/workspace/data", "DDP_WORKSHOP_DATASET": "synthetic"}


@pytest.mark.parametrize(("change", "message"), [
    # A patch for a container the runtime does not have adds one, with no image.
    (lambda m: pod_of(m)[0]["containers"][0].update(name="trainer"), "'node' was expected"),
    (lambda m: pod_of(m)[0]["volumes"][0].update(configmap={"name": "x"}), "'configmap'"),
    (lambda m: pod_of(m)[0]["containers"][0]["volumeMounts"][0].pop("mountPath"),
     "'mountPath' is a required property"),
    (lambda m: m["spec"]["runtimePatches"][0].pop("manager"), "'manager' is a required"),
])
def test_trainjob_schema_catches_a_patch_that_trainer_would_refuse(change, message):
    manifest = cluster.trainjob_manifest("train.py", nodes=2, gpus_per_node=1, cpus_per_node=4)
    change(manifest)
    with pytest.raises(jsonschema.ValidationError, match=message):
        jsonschema.validate(manifest, TRAINJOB_SCHEMA)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"scripts": "My Scripts"}, "ConfigMap"),
    ({"script": "scripts/train.py"}, "a file name in the ConfigMap"),
    ({"checkpoint_claim": "-claim"}, "claim"),
    ({"dataset": "imagenet"}, "dataset"),
])
def test_kubernetes_jobs_reject_bad_volumes_and_data_sets(kwargs, message):
    script = kwargs.pop("script", "train.py")
    for build in (cluster.pytorchjob_manifest, cluster.trainjob_manifest):
        with pytest.raises(ValueError, match=message):
            build(script, nodes=2, gpus_per_node=1, cpus_per_node=4, **kwargs)


def test_host_commands_are_the_same_command_on_every_host():
    commands = cluster.host_commands("train.py", hosts=["node1", "node2"], nproc_per_node=4,
                                     args=ARGS, port=29500)
    assert commands[0] == commands[1] == cluster.torchrun_command(
        "train.py", nnodes=2, nproc_per_node=4, rdzv_endpoint="node1:29500", args=ARGS)


def test_ssh_jobs_take_their_port_from_the_job_and_the_user(monkeypatch):
    """Two people's jobs whose first host is the same machine meet at two stores."""
    def endpoint(**given) -> str:
        (command, _) = cluster.host_commands("train.py", hosts=["node1", "node2"],
                                             nproc_per_node=1, **given)
        (option,) = [word for word in command if word.startswith("--rdzv-endpoint=")]
        return option.split("=")[1]

    mine = endpoint()
    assert mine == f"node1:{cluster.job_port('ddp-workshop')}" and mine != "node1:29500"
    assert 20000 <= int(mine.split(":")[1]) < 30000  # below Linux's outgoing ports
    assert endpoint() == mine  # every host's command, every time: the same port
    assert endpoint(rdzv_id="second-job") != mine
    assert endpoint(port=29500) == "node1:29500"
    monkeypatch.setattr("os.getuid", lambda: 4242)  # another person
    assert endpoint() != mine


def test_ssh_commands_run_the_host_commands_remotely():
    hosts = ["node1", "10.0.0.2"]
    lines = cluster.ssh_commands("train.py", hosts=hosts, nproc_per_node=2, workdir="~/course",
                                 args=["--note", "two words"])
    commands = cluster.host_commands("train.py", hosts=hosts, nproc_per_node=2,
                                     args=["--note", "two words"])
    for line, host, command in zip(lines, hosts, commands, strict=True):
        ssh, target, remote = shlex.split(line)
        assert (ssh, target) == ("ssh", host)
        cd, workdir, conjunction, *words = shlex.split(remote)
        assert (cd, workdir, conjunction) == ("cd", "~/course", "&&")
        assert words == command
    assert "cd ~/course" in lines[0]  # unquoted: the remote shell expands ~


@pytest.mark.parametrize(("hosts", "message"), [
    ([], "list of host names"),
    ("node1", "list of host names"),
    (["node1", "node1"], "distinct"),
    (["node 1"], "not a host name"),
])
def test_ssh_commands_reject_bad_hosts(hosts, message):
    with pytest.raises(ValueError, match=message):
        cluster.ssh_commands("train.py", hosts=hosts, nproc_per_node=1)


def test_jobs_with_restarts_give_every_attempt_its_own_store():
    """Restarted workers must not read the failed attempt's addresses (see ddp_lib.launch)."""
    plain = cluster.slurm_script("train.py", nodes=2, gpus_per_node=0, cpus_per_task=2)
    elastic = cluster.slurm_script("train.py", nodes=2, gpus_per_node=0, cpus_per_task=2,
                                   max_restarts=3)
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plain
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in elastic
    assert elastic.index("export TORCH_DISABLE") < elastic.index("\nsrun ")
    pbs = cluster.pbs_script("train.py", nodes=2, gpus_per_node=0, cpus_per_node=2,
                             launcher="torchrun", max_restarts=3)
    assert "--max-restarts=3" in pbs_command(pbs)
    assert pbs.index("export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1") < pbs.index("\nmpiexec ")

    manifest = cluster.pytorchjob_manifest("train.py", nodes=2, gpus_per_node=0,
                                           cpus_per_node=2, image="img", max_restarts=1)
    jsonschema.validate(manifest, SCHEMA)
    for replica in ("Master", "Worker"):
        container = manifest["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"][
            "containers"][0]
        assert {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"} in container["env"]

    for command in cluster.ssh_commands("train.py", hosts=["a", "b"], nproc_per_node=1,
                                        max_restarts=1):
        remote = shlex.split(command)[2]
        assert remote.startswith("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun ")


def test_pytorchjob_command_stays_on_c10d_beside_the_operators_variables(monkeypatch):
    """The training operator (v1.7 to v1.9) also sets PET_ variables in every pod, which torchrun
    reads for the options it is not given. The command names its rendezvous and sizes, so a
    worker pod's PET_NODE_RANK and PET_NPROC_PER_NODE=auto change nothing, and the job stays on
    c10d, where TORCH_DISABLE_SHARE_RDZV_TCP_STORE applies (the static rendezvous ignores it)."""
    from torch.distributed.run import parse_args

    manifest = cluster.pytorchjob_manifest("train.py", nodes=3, gpus_per_node=4,
                                           cpus_per_node=16, image="img", args=ARGS,
                                           name="resnet", port=29500)
    second_worker = {"MASTER_ADDR": "resnet-master-0", "MASTER_PORT": "29500", "RANK": "2",
                     "WORLD_SIZE": "3", "PET_MASTER_ADDR": "resnet-master-0",
                     "PET_MASTER_PORT": "29500", "PET_NODE_RANK": "2", "PET_NNODES": "3",
                     "PET_NPROC_PER_NODE": "auto"}
    for name, value in second_worker.items():
        monkeypatch.setenv(name, value)
    program, *words = manifest_command(manifest, "Worker")
    options = parse_args(words)
    assert program == "torchrun"
    assert (options.rdzv_backend, options.rdzv_endpoint, options.rdzv_id) == (
        "c10d", "$(MASTER_ADDR):$(MASTER_PORT)", "resnet")
    assert (options.nnodes, options.nproc_per_node) == ("3", "4")
    # Without its options, the same pod would run torchrun's static rendezvous from PET_*.
    bare = parse_args(["train.py"])
    assert (bare.rdzv_backend, bare.nnodes, int(bare.node_rank)) == ("static", "3", 2)
    assert bare.nproc_per_node == "auto"


def test_slurm_script_with_notice_requeues_itself_after_the_ranks_stop(tmp_path):
    """The trap runs only between commands, so srun runs in the background and the shell waits;
    the script is told where the stop file will appear and to resume (tests/test_slurm.py runs
    it on a real Slurm)."""
    text = cluster.slurm_script("train_ddp_resume.py", nodes=2, gpus_per_node=4,
                                cpus_per_task=16, notice_s=300, port=29400)
    options = re.findall(r"^#SBATCH (--\S+)", text, flags=re.MULTILINE)
    assert {"--signal=B:USR1@300", "--requeue", "--open-mode=append"} <= set(options)
    assert slurm_command(text)[-4:] == ["--resume", "--stop-file", "$STOP_FILE", "&"]
    assert text.rstrip().endswith("&\nwait")
    trap = next(line for line in text.splitlines() if line.startswith("trap "))
    assert shlex.split(trap)[1:] == [
        'touch "$STOP_FILE"; wait; scontrol requeue "$SLURM_JOB_ID"', "USR1"]
    assert "--signal" not in cluster.slurm_script("t.py", nodes=1, gpus_per_node=0,
                                                  cpus_per_task=1)
    with pytest.raises(ValueError, match="notice_s"):
        cluster.slurm_script("t.py", nodes=1, gpus_per_node=0, cpus_per_task=1, notice_s=0)
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    subprocess.run(["bash", "-n", str(path)], check=True, capture_output=True)
