"""Running a lesson's script under ``torchrun`` (or ``mpiexec``) from a notebook cell.

One launch, in the order it happens:

* ``torchrun``: the one builder of the command a person types, and the environment variables that
  give the notebook its logs and rank labels;
* ``launcher``: ``launch`` and ``launch_nodes``: check the arguments, print the command, run it;
* ``supervise``: the launcher's processes, started and always stopped (timeout, interrupt, a
  failed node, a dying kernel); ``output``: what the cell shows meanwhile;
* ``torchrun_main``: torchrun's own ``main``, keeping its failures as data; ``worker_site``: what
  every rank runs first (stacks on SIGUSR1, its uncaught exception to a file); nothing else;
* ``records``, ``stacks``, ``metrics``: what the run left, each read once into
  ``result.LaunchResult``; ``messages``: the error a failed launch raises, naming the rank, the
  cause and the line; ``faults``: a rank killed on purpose, for the lessons on failures.
"""
