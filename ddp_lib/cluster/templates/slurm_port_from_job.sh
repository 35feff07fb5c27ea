# Its port, from the job's number, so that two jobs whose first node is the same machine
# never meet at one store; below the ports Linux gives outgoing connections (32768 and up).
PORT=$((20000 + SLURM_JOB_ID % 10000))
