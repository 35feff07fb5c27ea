"""Run by Python at start-up in every process a ``ddp_lib`` launch starts (this folder is first on
their ``PYTHONPATH``); it changes nothing in the learner's script.

In a torchrun worker it registers ``faulthandler`` on SIGUSR1: when a launch times out, or its
cell is interrupted, ``ddp_lib`` sends SIGUSR1 to each worker before stopping it, and the worker
writes every thread's Python stack to ``$DDP_WORKSHOP_STACKS/rank<RANK>.txt``. That is how a hung
job tells which line each rank was waiting on. faulthandler writes from its C signal handler, so
a rank stuck inside a collective (in C++, the GIL released or not) still answers.

A ``sitecustomize`` that was there before this one (a distribution's, a site's) still runs.
"""

import os
import sys


def _register_stack_dump() -> None:
    folder = os.environ.get("DDP_WORKSHOP_STACKS")
    rank = os.environ.get("RANK")
    if not folder or rank is None or "LOCAL_RANK" not in os.environ:
        return  # not a torchrun worker of a ddp_lib launch (the agent itself, for instance)
    import faulthandler
    import signal

    if not hasattr(signal, "SIGUSR1"):
        return
    os.makedirs(folder, exist_ok=True)
    # Kept open for the life of the process: faulthandler writes to its file descriptor.
    stream = open(os.path.join(folder, f"rank{rank}.txt"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True)
    globals()["_stack_file"] = stream


def _run_the_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_register_stack_dump()
_run_the_next_sitecustomize()
