"""Job files for real clusters, all built from one ``torchrun`` command.

On a cluster nobody calls ``ddp_lib.launch``: a scheduler starts one ``torchrun`` agent per
machine, and the agents meet at a rendezvous endpoint (``host:port`` of one of the machines). With
the ``c10d`` rendezvous the command is the same on every machine, so the files differ only in how
they name the first machine: Slurm's and PBS's batch scripts read it into ``$HEAD_NODE``
(``batch``), Kubernetes puts it in ``$(MASTER_ADDR)`` (``kubernetes``), and over SSH it is the
first host listed (``commands``). A PBS script can also leave torchrun out, as HPC centres' courses
do: ``mpiexec`` starts every process. These functions write files; they run nothing.
"""

from ddp_lib.cluster.batch import pbs_script, slurm_script
from ddp_lib.cluster.commands import host_commands, ssh_commands, torchrun_command
from ddp_lib.cluster.kubernetes import pytorchjob_manifest, to_yaml, trainjob_manifest

__all__ = ["host_commands", "pbs_script", "pytorchjob_manifest", "slurm_script", "ssh_commands",
           "to_yaml", "torchrun_command", "trainjob_manifest"]
