"""Run at start-up by every process of a ``ddp_lib`` launch (this folder leads its ``PYTHONPATH``).
It only observes, and only dumps stacks: a rank (a torchrun worker, with ``RANK`` and
``LOCAL_RANK``, or an ``mpiexec`` one, with ``PMI_RANK``) behaves as under the printed command.

On SIGUSR1, sent before a timed-out or interrupted launch is stopped, a rank writes every thread's
stack to ``$DDP_WORKSHOP_STACKS/rank<RANK>.txt`` from faulthandler's C signal handler, which
answers even in a collective; on a native crash, to stderr, as torchrun's ``@record`` has it do.
An uncaught exception is the script's own business: torchrun's error file is written by the
script's ``@record`` (the lessons' trainers carry it), and the launch reads every other rank's
exception from its traceback. Under mpiexec, output is line-buffered, or mpiexec's rank labels
would cut a line written in pieces. Nothing here works around a torch bug
(``docs/compatibility.md``); an earlier ``sitecustomize`` still runs.
"""

import os
import sys


def _launched_rank():
    """This process's rank if a ddp_lib launch started it as one, else ``None`` (e.g. the agent)."""
    if not os.environ.get("DDP_WORKSHOP_STACKS"):
        return None
    if "RANK" in os.environ and "LOCAL_RANK" in os.environ:
        return os.environ["RANK"]
    return os.environ.get("PMI_RANK")


def _register_stack_dump() -> None:
    folder = os.environ.get("DDP_WORKSHOP_STACKS")
    rank = _launched_rank()
    if rank is None:
        return
    import faulthandler
    import signal

    # On a native crash (SIGSEGV, SIGABRT, ...) the stacks go to stderr: the report shows the line.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    if not hasattr(signal, "SIGUSR1"):
        return
    os.makedirs(folder, exist_ok=True)
    # Kept open for the life of the process: faulthandler writes to its file descriptor.
    stream = open(os.path.join(folder, f"rank{rank}.txt"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True)
    globals()["_stack_file"] = stream


def _line_buffered_under_mpiexec() -> None:
    if _launched_rank() is None or "RANK" in os.environ:
        return  # torchrun labels whole lines itself
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=False)


def _run_the_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_register_stack_dump()
_line_buffered_under_mpiexec()
_run_the_next_sitecustomize()
