# Its port, from the job's number, so that two jobs on this machine do not pick the
# same one; below the ports Linux gives outgoing connections (32768 and up).
JOB_NUMBER=${PBS_JOBID%%[!0-9]*}  # 1234 of 1234.server or 1234[5].server
PORT=$((20000 + JOB_NUMBER % 10000))
