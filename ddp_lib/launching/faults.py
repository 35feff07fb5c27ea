"""Failures on purpose, for lessons that show a job surviving one (lesson 06's elastic run): a
background thread kills a worker while the cell waits in ``ddp_lib.launch``.
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
        self._thread = threading.Thread(target=self._watch, daemon=True, name=f"kill rank {rank}")
        self._thread.start()

    def wait(self) -> float | None:
        """After the launch: stop watching; the ``time.time()`` the signal was sent, or ``None``."""
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
        # Workers are grandchildren (under torchrun's agent), with RANK in their environment.
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
    """As soon as ``path`` exists, send ``sig`` to the worker of global rank ``rank``; returns at
    once (``wait()`` on the result after the launch). The default, ``SIGKILL``, is what the OOM
    killer or a lost machine does: no handler, no clean-up. Gives up after ``limit_s`` seconds."""
    return Kill(path, rank, sig, limit_s)
