# Near the time limit Slurm sends USR1 to this shell ({{notice}} s before it, --signal): the trap
# creates the stop file, so that the ranks stop after their next checkpoint, waits for them,
# and puts the job back in the queue (--requeue), where --resume goes on from that checkpoint.
# A shell runs a trap only between commands: srun runs in the background, and the shell waits.
# The notice must be longer than an epoch takes.
STOP_FILE=stop-$SLURM_JOB_ID
rm -f "$STOP_FILE"
trap 'touch "$STOP_FILE"; wait; scontrol requeue "$SLURM_JOB_ID"' USR1
