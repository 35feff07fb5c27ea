"""Job files for real clusters, all built from one ``torchrun`` command.

A scheduler starts one ``torchrun`` agent per machine, and the agents meet at a rendezvous
endpoint. With ``c10d`` the command is the same on every machine; the files differ in how they
name the first machine: ``$HEAD_NODE`` in Slurm's and PBS's scripts (``batch``), ``$(MASTER_ADDR)``
in Kubernetes (``kubernetes``), the first host over SSH (``commands``). A PBS script can also
leave torchrun out: ``mpiexec`` starts every process. These functions write files; they run nothing.
"""

from ddp_lib.cluster.batch import pbs_script, slurm_script
from ddp_lib.cluster.commands import host_commands, job_port, ssh_commands, torchrun_command
from ddp_lib.cluster.kubernetes import (
    CHECKPOINT_DIR,
    SCRIPTS_CONFIGMAP,
    pytorchjob_manifest,
    to_yaml,
    trainjob_manifest,
    volume_claim,
)

__all__ = ["CHECKPOINT_DIR", "SCRIPTS_CONFIGMAP", "host_commands", "job_port", "pbs_script",
           "pytorchjob_manifest", "slurm_script", "ssh_commands", "to_yaml", "torchrun_command",
           "trainjob_manifest", "volume_claim"]
