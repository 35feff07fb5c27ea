# mpiexec starts one torchrun per machine (--ppn 1), the same command on each; torchrun
# starts the machine's processes and sets RANK, LOCAL_RANK, ... for them (they also see
# mpiexec's PMI_RANK, the machine's index: a script that reads both prefers RANK).
# The job id names the rendezvous, so another job on the same nodes never joins it.
# The sizes are the allocation's, written once in the #PBS lines: the machines the node
# file lists, {{per_node}} on each.
NNODES=$(sort -u "$PBS_NODEFILE" | wc -l)
{{binding}}
{{restarts}}
mpiexec -n "$NNODES" --ppn 1{{bind}} {{command}}
