"""What an exercise check (``workshop.checks``) watches in each rank of a learner's script.

Only a check's launch puts this folder on the ranks' ``PYTHONPATH`` (after ``ddp_lib``'s worker
site, which runs it). It records and changes nothing a rank computes: the sample indices of every
batch a ``DataLoader`` draws, each ``torch.save`` and its path, each ``DistributedDataParallel``
wrapper made, each collective the script calls
(``dist.all_reduce``, ``dist.barrier``, ...) and the line that calls it, and whether the process
group is still open when the rank exits. Given ``DDP_WORKSHOP_CHECK_STALL_S``, a rank still in
one of those collectives after that many seconds says so and exits: a hang ends in a minute,
not at the launch's timeout. The records are JSON lines in the launch's metrics file, in the
form of ``course_helpers.report``. It waits until the script imports torch (an import hook), so
the script's own import order is kept.
"""

import atexit
import importlib.abc
import importlib.machinery
import itertools
import json
import os
import sys
import threading
import time

COLLECTIVES = ("all_reduce", "broadcast", "barrier", "all_gather", "all_gather_object",
               "broadcast_object_list", "reduce", "gather", "scatter", "reduce_scatter")
_waiting = {}  # the collective this rank is in: op, line, since


def _record(name: str, value: float, **extra) -> None:
    record = {"rank": int(os.environ["RANK"]), "step": None, "name": name, "value": value,
              "time": time.time(), **extra}
    fd = os.open(os.environ["DDP_LIB_METRICS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())  # one write: ranks never interleave
    finally:
        os.close(fd)


def _watch(torch) -> None:
    """Wrap what the check reads, once torch is imported: a wrapper calls the original as is."""
    from torch.utils.data import dataloader

    iterator = dataloader._BaseDataLoaderIter
    start, next_index, save = iterator.__init__, iterator._next_index, torch.save
    passes = itertools.count()

    def watched_start(self, loader, *args, **kwargs):
        start(self, loader, *args, **kwargs)
        self._checked_pass = next(passes)  # one pass over a loader: an epoch, or an evaluation
        try:
            self._checked_size = len(loader.dataset)
        except TypeError:  # an IterableDataset has no length
            self._checked_size = None

    def watched_next_index(self):
        indices = next_index(self)
        drawn = indices if isinstance(indices, list) else [indices]
        _record("check_drawn", self._checked_pass, size=self._checked_size,
                indices=[int(i) for i in drawn])
        return indices

    def watched_save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)):
            _record("check_saved", 1, path=os.path.abspath(os.fspath(f)))
        return save(obj, f, *args, **kwargs)

    iterator.__init__, iterator._next_index, torch.save = (
        watched_start, watched_next_index, watched_save)
    from torch.nn.parallel import DistributedDataParallel

    wrap = DistributedDataParallel.__init__

    def watched_wrap(self, *args, **kwargs):
        wrap(self, *args, **kwargs)
        _record("check_wrapped", 1)

    DistributedDataParallel.__init__ = watched_wrap
    import torch.distributed as dist

    for op in COLLECTIVES:
        if hasattr(dist, op):
            setattr(dist, op, _watched_collective(op, getattr(dist, op)))


def _script_line() -> tuple[int, str]:
    """The line of the script (its main file) that is running, and its function."""
    script = os.path.abspath(sys.argv[0])
    frame = sys._getframe(2)
    while frame is not None and os.path.abspath(frame.f_code.co_filename) != script:
        frame = frame.f_back
    return (frame.f_lineno, frame.f_code.co_name) if frame else (0, "")


def _watched_collective(op: str, call):
    def watched(*args, **kwargs):
        line, function = _script_line()
        if not line:  # torch's own use, not the script's
            return call(*args, **kwargs)
        _record("check_collective", 1, op=op, line=line, function=function)
        _waiting.update(op=op, line=line, since=time.monotonic())
        try:
            return call(*args, **kwargs)
        finally:
            _waiting.clear()

    return watched


def _stall_watch(limit: float) -> None:
    """Ends this rank when it has waited in one collective for ``limit`` seconds."""
    while True:
        time.sleep(1)
        since = _waiting.get("since")
        if since is not None and time.monotonic() - since > limit:
            _record("check_stuck", limit, op=_waiting["op"], line=_waiting["line"])
            sys.stderr.write(f"check: waited {limit:g} s in dist.{_waiting['op']} at line "
                             f"{_waiting['line']}; stopping this rank\n")
            sys.stderr.flush()
            os._exit(1)


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds ``torch`` as Python would, and calls ``_watch`` once its module has run."""

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def run_then_watch(module):
            run(module)
            _watch(module)

        spec.loader.exec_module = run_then_watch
        return spec


def _group_open_at_exit() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        _record("check_group_open_at_exit", 1)


if "RANK" in os.environ and "LOCAL_RANK" in os.environ and "DDP_LIB_METRICS_FILE" in os.environ:
    sys.meta_path.insert(0, _AfterTorchImport())
    atexit.register(_group_open_at_exit)
    if os.environ.get("DDP_WORKSHOP_CHECK_STALL_S"):
        threading.Thread(target=_stall_watch, args=(float(os.environ[
            "DDP_WORKSHOP_CHECK_STALL_S"]),), daemon=True, name="check-stall-watch").start()
