"""The ring all-reduce schedule, in pure Python: who sends which chunk to whom, step by step.

Lesson 03's figures draw this schedule, and its hand-written all-reduce over
``torch.distributed`` follows it, so the picture and the real code cannot disagree.

``N`` ranks stand in a ring; rank ``r`` only ever sends to its right neighbour ``(r + 1) % N``
and receives from its left neighbour ``(r - 1) % N``. Every rank cuts its tensor into ``N``
chunks. The all-reduce takes ``2 (N - 1)`` steps, in each of which every rank sends exactly one
chunk and receives exactly one:

1. **scatter-reduce** (``N - 1`` steps): at step ``s`` rank ``r`` sends chunk ``(r - s) % N`` and
   adds the chunk ``(r - s - 1) % N`` it receives to its own. Afterwards rank ``r`` holds chunk
   ``(r + 1) % N`` summed over all ranks.
2. **all-gather** (``N - 1`` steps): at step ``s`` rank ``r`` sends chunk ``(r + 1 - s) % N``, a
   finished one, and overwrites chunk ``(r - s) % N`` with the finished one it receives.

Each rank therefore sends ``2 (N - 1)`` chunks of ``S / N`` bytes: ``2 (N - 1) / N * S`` bytes,
less than ``2 S`` however many ranks take part.

The time models (``time_ring``, ``time_root``) price one message at ``alpha + bytes / beta``: a
latency plus the bytes over the bandwidth of one link, which sends and receives at once.
"""

from __future__ import annotations

from dataclasses import dataclass

SCATTER_REDUCE = "scatter-reduce"
ALL_GATHER = "all-gather"


@dataclass(frozen=True)
class Step:
    """One step of the ring: every rank sends one chunk right and receives one from the left.

    Attributes:
        index: position in the whole all-reduce, ``0 .. 2 (N - 1) - 1``.
        phase: ``"scatter-reduce"`` (received chunks are added) or ``"all-gather"`` (received
            chunks replace what was there).
        send: ``send[r]`` is the chunk rank ``r`` sends to rank ``(r + 1) % N``.
        recv: ``recv[r]`` is the chunk rank ``r`` receives from rank ``(r - 1) % N``.
    """

    index: int
    phase: str
    send: tuple[int, ...]
    recv: tuple[int, ...]

    @property
    def world_size(self) -> int:
        return len(self.send)


def _check(world_size: int) -> None:
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")


def right(rank: int, world_size: int) -> int:
    """The rank that ``rank`` sends to."""
    return (rank + 1) % world_size


def left(rank: int, world_size: int) -> int:
    """The rank that ``rank`` receives from."""
    return (rank - 1) % world_size


def schedule(world_size: int) -> list[Step]:
    """The ``2 (N - 1)`` steps of a ring all-reduce over ``N = world_size`` ranks, in order."""
    _check(world_size)
    n = world_size
    steps = []
    for s in range(n - 1):
        steps.append(Step(len(steps), SCATTER_REDUCE,
                          send=tuple((r - s) % n for r in range(n)),
                          recv=tuple((r - s - 1) % n for r in range(n))))
    for s in range(n - 1):
        steps.append(Step(len(steps), ALL_GATHER,
                          send=tuple((r + 1 - s) % n for r in range(n)),
                          recv=tuple((r - s) % n for r in range(n))))
    return steps


Holdings = tuple[tuple[frozenset[int], ...], ...]  # [rank][chunk] -> ranks summed into it


def simulate(world_size: int) -> list[Holdings]:
    """What every rank holds before the first step and after each step.

    Returns a list of ``2 (N - 1) + 1`` states; ``state[r][c]`` is the set of ranks whose chunk
    ``c`` has been added into rank ``r``'s chunk ``c`` (at the start, ``{r}``). All sends of a
    step happen at once: what a rank receives is what its left neighbour held before the step.
    A fully reduced chunk holds all ``N`` ranks.
    """
    _check(world_size)
    n = world_size
    state: Holdings = tuple(tuple(frozenset({r}) for _ in range(n)) for r in range(n))
    states = [state]
    for step in schedule(n):
        new = [list(row) for row in state]
        for r in range(n):
            src = left(r, n)
            chunk = step.recv[r]
            if step.send[src] != chunk:
                raise AssertionError(f"step {step.index}: rank {src} sends chunk "
                                     f"{step.send[src]}, rank {r} expects chunk {chunk}")
            incoming = state[src][chunk]
            if step.phase == SCATTER_REDUCE:
                if incoming & state[r][chunk]:
                    raise AssertionError(f"step {step.index}: rank {r} would add a rank twice")
                new[r][chunk] = state[r][chunk] | incoming
            else:
                new[r][chunk] = incoming
        state = tuple(tuple(row) for row in new)
        states.append(state)
    return states


def owned_after_scatter_reduce(rank: int, world_size: int) -> int:
    """The chunk that ``rank`` holds fully reduced when the scatter-reduce phase ends."""
    return (rank + 1) % world_size


def bytes_sent_ring(world_size: int, size_bytes: float) -> float:
    """Bytes each rank sends in a ring all-reduce of ``size_bytes``: ``2 (N - 1) / N * S``."""
    _check(world_size)
    return 2 * (world_size - 1) / world_size * size_bytes


def bytes_naive(world_size: int, size_bytes: float) -> float:
    """Bytes the busiest rank (the root) sends in an all-to-root scheme: ``(N - 1) * S``.

    Every rank sends its whole tensor to the root (a parameter server), which adds them up and
    sends the sum back to each of the ``N - 1`` others: the root receives ``(N - 1) S`` and
    sends ``(N - 1) S``, and that one link is the bottleneck.
    """
    _check(world_size)
    return (world_size - 1) * size_bytes


def time_ring(world_size: int, size_bytes: float, alpha: float, inv_beta: float) -> float:
    """Seconds of a ring all-reduce: ``2 (N - 1) alpha + 2 (N - 1) / N * S / beta``.

    ``2 (N - 1)`` steps, each one message of ``S / N`` bytes per rank; every rank sends and
    receives at the same time, so a step costs one message. ``inv_beta`` is ``1 / beta``,
    seconds per byte.
    """
    return 2 * (world_size - 1) * alpha + bytes_sent_ring(world_size, size_bytes) * inv_beta


def time_root(world_size: int, size_bytes: float, alpha: float, inv_beta: float) -> float:
    """Seconds of the all-to-root scheme: ``2 (N - 1) alpha + 2 (N - 1) S / beta``.

    The root receives ``N - 1`` messages of ``S`` bytes, one after the other on its one link,
    and can send the sum only once it has them all: then ``N - 1`` messages of ``S`` bytes go
    back out. ``2 (N - 1)`` messages and ``2 (N - 1) S`` bytes pass through the root's link in
    turn, ``N`` times the ring's bytes term (already twice it for ``N = 2``).
    """
    _check(world_size)
    return 2 * (world_size - 1) * (alpha + size_bytes * inv_beta)
