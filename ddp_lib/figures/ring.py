"""The ring all-reduce schedule in pure Python, which lesson 03's figures draw and its hand-written
all-reduce follows, so that the two cannot disagree.

Rank ``r`` of ``N`` sends only to ``(r + 1) % N`` and receives only from ``(r - 1) % N``. In
``N - 1`` scatter-reduce steps it adds each chunk it receives to its own, ending with chunk
``(r + 1) % N`` summed over all ranks; in ``N - 1`` all-gather steps the finished chunks go round.
Each rank sends ``2 (N - 1) / N * S`` bytes, less than ``2 S`` however many ranks take part. The
time models price a message at ``alpha + bytes / beta``; a link sends and receives at once.
"""

from __future__ import annotations

from dataclasses import dataclass

SCATTER_REDUCE = "scatter-reduce"
ALL_GATHER = "all-gather"


@dataclass(frozen=True)
class Step:
    """One step: rank ``r`` sends chunk ``send[r]`` right and receives ``recv[r]`` from the left,
    to add (``phase`` ``"scatter-reduce"``) or to put in place of its own (``"all-gather"``)."""

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
    """What every rank holds before the first step and after each: ``state[r][c]`` is the set of
    ranks whose chunk ``c`` is summed into rank ``r``'s (``{r}`` at first). All sends of a step
    happen at once: a rank receives what its left neighbour held before."""
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
    """Bytes the root sends in an all-to-root scheme (a parameter server): ``(N - 1) * S``, the
    sum back to every other rank, after receiving as much; that one link is the bottleneck."""
    _check(world_size)
    return (world_size - 1) * size_bytes


def time_ring(world_size: int, size_bytes: float, alpha: float, inv_beta: float) -> float:
    """Seconds of a ring all-reduce: ``2 (N - 1) alpha + 2 (N - 1) / N * S / beta``; ``inv_beta``
    is ``1 / beta``, seconds per byte. Every rank sends and receives at once: one message a step."""
    return 2 * (world_size - 1) * alpha + bytes_sent_ring(world_size, size_bytes) * inv_beta


def time_root(world_size: int, size_bytes: float, alpha: float, inv_beta: float) -> float:
    """Seconds of the all-to-root scheme: ``2 (N - 1) alpha + 2 (N - 1) S / beta``. The root's one
    link takes ``N - 1`` messages of ``S`` bytes in turn, then sends the sum back in ``N - 1`` more:
    ``N`` times the ring's bytes term."""
    _check(world_size)
    return 2 * (world_size - 1) * (alpha + size_bytes * inv_beta)
