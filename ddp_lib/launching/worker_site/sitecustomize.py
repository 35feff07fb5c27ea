"""Run by Python at start-up in every process a ``ddp_lib`` launch starts (this folder is first on
their ``PYTHONPATH``). It only observes: a rank behaves as under the printed command.

A rank is a torchrun worker (``RANK`` and ``LOCAL_RANK`` set) or a process that ``mpiexec``
started (``PMI_RANK``: the script itself sets torch's variables from it).

In a rank it registers ``faulthandler`` on SIGUSR1: when a launch times out, or its cell is
interrupted, ``ddp_lib`` sends SIGUSR1 to each worker before stopping it, and the worker writes
every thread's Python stack to ``$DDP_WORKSHOP_STACKS/rank<RANK>.txt``. That is how a hung job
tells which line each rank was waiting on. faulthandler writes from its C signal handler, so a
rank stuck inside a collective (in C++, the GIL released or not) still answers. A worker that
crashes in native code (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) prints every thread's Python
stack to its stderr first, so the failure message shows the line it was on.

It also does for every script what torchrun's ``@record`` decorator does for the function it
wraps: an uncaught exception is written to the error file torchrun names in
``TORCHELASTIC_ERROR_FILE``, by torch's own ``ErrorHandler``, so torchrun's failure report shows the
exception, and its ``ChildFailedError`` hands it to ``ddp_lib`` with the rank's exit code
(``ddp_lib.failures``) instead of leaving it in interleaved output. Under mpiexec, which reads
no error file, the exception goes to ``$DDP_WORKSHOP_RANK_ERRORS/rank<N>.error.json``: the launch
stops the other ranks when it appears, as torchrun would. That is done only where the
script has imported torch: importing it just to write the file would cost a second or two of CPU
(a script that fails before, a ``SyntaxError`` say, still prints its traceback, which ``ddp_lib``
reads instead).

Under mpiexec, a rank's standard output and error are line-buffered: mpiexec labels each piece
of output it reads with the rank, so a line written in pieces (``print(a, b)`` unbuffered writes
four) would come out cut into labelled fragments.

Nothing here works around a torch bug: a script that needs a workaround carries it as a line of
its own (``docs/compatibility.md`` lists them). A ``sitecustomize`` that was there before this
one (a distribution's, a site's) still runs.
"""

import os
import sys


def _launched_rank():
    """This process's rank if a ddp_lib launch started it as a rank, else ``None`` (torchrun's
    agent itself, for instance)."""
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

    # A rank that crashes in C++ (SIGSEGV, SIGABRT, ...) prints every thread's Python stack to its
    # stderr before it dies, so the failure message can say which line it was on.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    if not hasattr(signal, "SIGUSR1"):
        return
    os.makedirs(folder, exist_ok=True)
    # Kept open for the life of the process: faulthandler writes to its file descriptor.
    stream = open(os.path.join(folder, f"rank{rank}.txt"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True)
    globals()["_stack_file"] = stream


def _error_file():
    """Where this rank writes its uncaught exception: the file torchrun names, or under mpiexec
    one of the launch's; ``None`` if neither (not a rank, or torchrun keeps no error files)."""
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
    """torch's ``ErrorHandler.record_exception``, written under another name, then renamed.

    Written whole or not at all: torchrun stops the other ranks as soon as one fails, and since
    pytorch/pytorch#160908 (2025; 2.14 does, 2.4 does not) it reads the error file of every rank
    it stopped. A file cut short by its SIGTERM would make torchrun's agent fail on the JSON
    instead of reporting the failures.
    """
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
