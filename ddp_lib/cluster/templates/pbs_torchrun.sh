# mpiexec starts one torchrun per machine (--ppn 1), the same command on each; torchrun
# starts the machine's processes and sets RANK, LOCAL_RANK, ... for them (they also see
# mpiexec's PMI_RANK, the machine's index: a script that reads both prefers RANK).
# The job id names the rendezvous, so another job on the same nodes never joins it.
{{restarts}}
mpiexec -n {{nodes}} --ppn 1 {{command}}
