"""Failures on purpose, for the lessons that show a job surviving one (lesson 06's elastic run).

Killing a worker in the middle of a launch needs a watcher outside the launch, running while
the cell waits in ``ddp_lib.launch``. That watcher is a background thread; it lives here, so
that the lesson shows the experiment (which rank, when, which signal) and not the plumbing.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil


class Kill:
    """A kill that is waiting for its moment, in a background thread; ``wait()`` for it."""

    def __init__(self, path: str | os.PathLike, rank: int, sig: signal.Signals, limit_s: float):
        self.path, self.rank, self.sig, self.limit_s = os.fspath(path), rank, sig, limit_s
        self.killed_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f"kill rank {rank}")
        self._thread.start()

    def wait(self) -> float | None:
        """Call it once the launch has ended: stops watching (there is nothing left to kill) and
        returns the time (``time.time()``) the signal was sent, or ``None`` if it never was."""
        self._stop.set()
        self._thread.join()
        return self.killed_at

    def _watch(self) -> None:
        deadline = time.monotonic() + self.limit_s
        while time.monotonic() < deadline and not self._stop.is_set():
            if os.path.exists(self.path) and self._signal_worker():
                return
            self._stop.wait(0.02)

    def _signal_worker(self) -> bool:
        # Workers are grandchildren of this process (under torchrun's agent), RANK in their
        # environment.
        for process in psutil.Process().children(recursive=True):
            try:
                if process.environ().get("RANK") == str(self.rank):
                    process.send_signal(self.sig)
                    self.killed_at = time.time()
                    return True
            except psutil.Error:  # ended meanwhile, or not ours to read
                continue
        return False


def kill_rank_when_file_exists(path: str | os.PathLike, rank: int,
                               sig: signal.Signals = signal.SIGKILL,
                               limit_s: float = 300.0) -> Kill:
    """As soon as ``path`` exists, send ``sig`` to the worker of global rank ``rank``.

    Returns at once; call it before ``ddp_lib.launch`` and ``wait()`` on the result after. The
    default, ``SIGKILL``, is what the out-of-memory killer or a lost machine does to a process:
    no handler runs, no clean-up. Gives up after ``limit_s`` seconds.
    """
    return Kill(path, rank, sig, limit_s)
