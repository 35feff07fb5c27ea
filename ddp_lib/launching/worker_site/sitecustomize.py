"""Run at start-up by every process of a ``ddp_lib`` launch (this folder leads its ``PYTHONPATH``).
It only observes: a rank (a torchrun worker, with ``RANK`` and ``LOCAL_RANK``, or an ``mpiexec``
one, with ``PMI_RANK``) behaves as under the printed command.

On SIGUSR1, sent before a timed-out or interrupted launch is stopped, a rank writes every thread's
stack to ``$DDP_WORKSHOP_STACKS/rank<RANK>.txt`` from faulthandler's C signal handler, which
answers even in a collective. An uncaught exception goes, as with torchrun's ``@record``, through
torch's ``ErrorHandler`` to ``TORCHELASTIC_ERROR_FILE`` or, under mpiexec, to
``$DDP_WORKSHOP_RANK_ERRORS/rank<N>.error.json`` (the launch then stops the other ranks); only once
torch is imported, as importing it for this costs a second or two. Under mpiexec, output is
line-buffered, or mpiexec's rank labels would cut a line written in pieces. Nothing here works
around a torch bug (``docs/compatibility.md``); an earlier ``sitecustomize`` still runs.
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


def _error_file():
    """This rank's error file: torchrun's, or under mpiexec the launch's; ``None`` if neither."""
    rank = _launched_rank()
    if rank is None:
        return None
    if "RANK" in os.environ:
        return os.environ.get("TORCHELASTIC_ERROR_FILE")
    folder = os.environ.get("DDP_WORKSHOP_RANK_ERRORS")
    return os.path.join(folder, f"rank{rank}.error.json") if folder else None


def _record_uncaught_exceptions() -> None:
    error_file = _error_file()
    if not error_file:
        return
    previous_hook = sys.excepthook

    def record_then_print(exc_type, exc, tb) -> None:
        # As @record: not KeyboardInterrupt; and only where torch is in already.
        if issubclass(exc_type, Exception) and "torch" in sys.modules:
            _write_error_file(error_file, exc, tb)
        previous_hook(exc_type, exc, tb)

    sys.excepthook = record_then_print


def _write_error_file(path: str, exc: BaseException, tb) -> None:
    """torch's ``ErrorHandler.record_exception``, to another name, then renamed: since
    pytorch/pytorch#160908 (2.14 does, 2.4 does not) torchrun reads the error file of every rank
    it stopped, and one cut short by its SIGTERM would make its agent fail on the JSON."""
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    partial = path + ".tmp"

    class ToPartialFile(ErrorHandler):
        def _get_error_file_path(self) -> str:
            return partial

    try:
        raise exc  # record_exception reads the exception being handled (traceback.format_exc)
    except BaseException as handled:
        handled.__traceback__ = tb  # the script's frames only, without this one
        try:
            ToPartialFile().record_exception(handled)
            os.replace(partial, path)
        except (OSError, TypeError, ValueError):  # the exception is still printed and reported
            try:
                os.remove(partial)
            except OSError:
                pass


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
_record_uncaught_exceptions()
_run_the_next_sitecustomize()
