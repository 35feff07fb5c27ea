# mpiexec starts {{nproc}} process(es) on each machine and tells each its rank in its
# own variables (PMI_RANK, PMI_SIZE, a local rank), which the script maps onto
# torch's. Rank 0 serves the group's store at MASTER_ADDR:MASTER_PORT. mpiexec hands
# this environment to every process, on every machine.
{{binding}}
export MASTER_ADDR=$HEAD_NODE MASTER_PORT={{port}}
{{command}}
