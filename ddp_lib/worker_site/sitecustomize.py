"""Run by Python at start-up in every process a ``ddp_lib`` launch starts (this folder is first on
their ``PYTHONPATH``); it changes nothing in the learner's script.

A rank is a torchrun worker (``RANK`` and ``LOCAL_RANK`` set) or a process that MPICH's
``mpiexec`` started (``PMI_RANK``: the script itself sets torch's variables from it).

In a rank it registers ``faulthandler`` on SIGUSR1: when a launch times out, or its
cell is interrupted, ``ddp_lib`` sends SIGUSR1 to each worker before stopping it, and the worker
writes every thread's Python stack to ``$DDP_WORKSHOP_STACKS/rank<RANK>.txt``. That is how a hung
job tells which line each rank was waiting on. faulthandler writes from its C signal handler, so
a rank stuck inside a collective (in C++, the GIL released or not) still answers.

A worker that crashes in native code (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) prints every
thread's Python stack to its stderr first, so the failure message shows the line it was on.

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

At exit, after every other exit handler, it first lets Gloo's worker threads finish dropping
their last collectives (``_wait_for_gloo_workers``: on torch 2.11 and later one that is still
dropping a tensor Python saw when Python shuts down aborts the rank), then skips Python's last
garbage collection (``gc.freeze``). That collection walks every object torch, torchvision and
``torch._dynamo`` created, only to free memory the operating system takes back anyway: it cost
about 1 CPU-s per process, 2 to 3 CPU-s per two-rank launch on a 2-core machine
(``docs/benchmarks.md``, section 1).
Python does not promise to finalize what is left at exit; what the lessons write (checkpoints,
metrics, traces, error files) is written and closed before.

When the script imports ``torch``, it imports ``torch.distributed.nn`` right after, before the
script's next line, so before ``init_process_group``. That module's functions keep
``group.WORLD`` *of the moment of import* as a default argument: imported after
``init_process_group``, it holds the default group for good, ``destroy_process_group`` cannot
free it, Gloo's worker threads outlive it, and now and then one of them aborts the process at exit
("terminate called without an active exception"; ``tests/test_clean_shutdown.py``). Imported
before, it holds nothing. Who imports it depends on the release: torch 2.14's DDP does when it is
constructed (through ``torch._dynamo``), 2.4's never does; torchvision 0.29 does at its own
import, 0.19 does not. It is needed where DDP imports it and nothing did before. A script that
never imports torch pays nothing here (importing torch costs seconds of CPU); one that does pays
the module's import, tens of milliseconds. On torch before 2.8 it also makes
``destroy_process_group`` release the GIL for a moment first (``_let_gloo_finish_before_destroy``).

Under mpiexec, a rank's standard output and error are line-buffered: mpiexec labels each piece
of output it reads with the rank, so a line written in pieces (``print(a, b)`` unbuffered writes
four) would come out cut into labelled fragments.

A ``sitecustomize`` that was there before this one (a distribution's, a site's) still runs.
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


def _at_exit() -> None:
    import atexit
    import gc

    def let_gloo_finish_then_skip_the_collection() -> None:
        if "torch.distributed" in sys.modules:
            _wait_for_gloo_workers()
        gc.freeze()

    # Registered before the script and its libraries register theirs, so it runs after them all.
    atexit.register(let_gloo_finish_then_skip_the_collection)


GLOO_WORKER = "pt_gloo_runloop"  # the name torch gives Gloo's worker threads (2.11 does, 2.8 not)


def _gloo_worker_states() -> list[str]:
    """The state letter (``R`` runnable, ``S`` asleep, ...) of each of Gloo's worker threads, from
    ``/proc`` (Linux); empty where there is none, or none can be told by its name."""
    states = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return states
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/stat") as stat:
                fields = stat.read()
        except OSError:  # the thread ended while we looked
            continue
        name, _, rest = fields.partition("(")[2].rpartition(")")
        if name == GLOO_WORKER:
            states.append(rest.split()[0])
    return states


def _wait_for_gloo_workers(timeout: float = 1.0) -> None:
    """Release the GIL until every Gloo worker thread is asleep, twice in a row (at most
    ``timeout`` seconds; a few milliseconds when they are idle).

    A worker drops each finished collective *after* the rank that waited on it has moved on; when
    the work holds a tensor that Python also saw (``all_gather_object``'s, say), torch 2.11 and
    later take the GIL to drop it (``TensorImpl::decref_pyobject``). If Python has begun to shut
    down by then, taking the GIL ends the thread, which C++ turns into ``std::terminate``: the rank
    aborts (SIGABRT, "terminate called without an active exception") after its work is done. That
    happens whenever the process group outlives ``destroy_process_group`` (a model that still holds
    it, FSDP's cached device mesh), about one rank exit in five with ``all_gather_object`` last
    (pytorch/pytorch#190489). Sleeping hands the GIL to a worker that waits for it; a worker that
    is runnable but not yet running gets the time to run.
    """
    import time

    deadline = time.monotonic() + timeout
    asleep_in_a_row = 0
    while asleep_in_a_row < 2 and time.monotonic() < deadline:
        time.sleep(0.002)
        states = _gloo_worker_states()
        if not states:
            return
        asleep_in_a_row = asleep_in_a_row + 1 if all(state == "S" for state in states) else 0


class _DistributedNnAfterTorch:
    """Finds ``torch`` as usual, and imports ``torch.distributed.nn`` as soon as torch is in."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        import importlib.util

        sys.meta_path.remove(self)  # once, and so that the search below finds the real torch
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenDistributedNn(spec.loader)
        return spec


class _ThenDistributedNn:
    """torch's own loader, followed by ``import torch.distributed.nn``."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        module.__spec__.loader = module.__loader__ = self.loader  # torch keeps its own loader
        import importlib

        dist = importlib.import_module("torch.distributed")
        if dist.is_available():
            importlib.import_module("torch.distributed.nn")
            if _destructor_holds_the_gil(module.__version__):
                _let_gloo_finish_before_destroy(dist)


def _destructor_holds_the_gil(version: str) -> bool:
    """Whether this torch destroys a process group without releasing the GIL (before 2.8).

    pytorch/pytorch#154976 (merged 2025-06-04) releases it in the destructor: from 2.8 by its
    date, not run there; 2.11 and 2.14 were run without the pause.
    """
    major, minor = (int(part) for part in version.split(".")[:2])
    return (major, minor) < (2, 8)


def _let_gloo_finish_before_destroy(dist) -> None:
    """Before torch 2.8, give Gloo's worker threads the GIL before the group is destroyed.

    ``~ProcessGroupGloo`` joins its worker threads while the caller holds the GIL. A worker may
    still be dropping a finished work (on 2.4, a ``barrier()``'s work keeps the works that were in
    flight when it was queued) whose tensor has a Python object, and freeing that needs the GIL:
    the process hangs in ``destroy_process_group()`` for good (``docs/compatibility.md``). A short
    sleep first, which releases the GIL, lets the workers finish; it costs 0.2 s per process.
    """
    import functools
    import time

    destroy = dist.destroy_process_group

    @functools.wraps(destroy)
    def destroy_process_group(*args, **kwargs):
        time.sleep(0.2)
        return destroy(*args, **kwargs)

    dist.destroy_process_group = destroy_process_group


def _line_buffered_under_mpiexec() -> None:
    if _launched_rank() is None or "RANK" in os.environ:
        return  # torchrun labels whole lines itself
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=False)


def _import_torch_distributed_nn_with_torch() -> None:
    if _launched_rank() is None or "torch" in sys.modules:
        return  # not a rank of a ddp_lib launch, or torch came in before
    sys.meta_path.insert(0, _DistributedNnAfterTorch())


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
_at_exit()
_import_torch_distributed_nn_with_torch()
_run_the_next_sitecustomize()
