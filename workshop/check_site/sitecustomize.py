"""What an exercise check (``workshop.checks``) watches in each rank of a learner's script.

Only a check's launch puts this folder on the ranks' ``PYTHONPATH`` (after ``ddp_lib``'s worker
site, which runs it). It records and changes nothing a rank computes: the sample indices of every
batch a ``DataLoader`` draws, each ``torch.save`` and its path, and whether the process group is
still open when the rank exits. The records are JSON lines in the launch's metrics file, in the
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
import time


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
