"""All-reduce bandwidth of dist.all_reduce, lesson 03's ring and a gather-to-root scheme.

Run by torchrun: python -m torch.distributed.run --nproc-per-node=N allreduce_bandwidth.py
    RING_DIR SIZES_BYTES REPEATS
RING_DIR holds ring_allreduce.py as lesson 03 writes it: the ring measured is the lesson's code.
Each rank reports its time of every repetition, per size and method (course_helpers.report); rank 0
also times a one-process memory copy of the same size, a limit for any scheme that moves bytes
through memory.
"""
import sys
import time
from functools import partial

import torch
import torch.distributed as dist

from course_helpers import report

sys.path.insert(0, sys.argv[1])
from ring_allreduce import ring_all_reduce  # noqa: E402  (lesson 03's function, unchanged)


def root_all_reduce(tensor):
    """The naive scheme: every rank sends to rank 0, which adds and sends the sum back."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        incoming = torch.empty_like(tensor)
        for source in range(1, world_size):
            dist.recv(incoming, source)
            tensor.add_(incoming)
        for request in [dist.isend(tensor, dest) for dest in range(1, world_size)]:
            request.wait()
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)


def seconds(fn, x):
    """Time of fn on a fresh copy of x, all ranks starting together."""
    y = x.clone()
    dist.barrier()
    start = time.perf_counter()
    fn(y)
    return time.perf_counter() - start


def main():
    sizes = [int(s) for s in sys.argv[2].split(",")]
    repeats = int(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    def methods(numel):
        """The three schemes; the ring keeps its buffer between calls, as the lesson times it."""
        buffer = torch.empty(numel // world_size + 1)
        return {"all_reduce": dist.all_reduce, "ring": partial(ring_all_reduce, buffer=buffer),
                "root": root_all_reduce}

    x = torch.randn(max(sizes) // 4 + 1, generator=torch.Generator().manual_seed(rank))
    expected = x.clone()
    dist.all_reduce(expected)
    for name, fn in methods(len(x)).items():  # all three compute the same sum
        y = x.clone()
        fn(y)
        assert torch.allclose(y, expected, rtol=1e-4, atol=1e-4), name

    for size in sizes:
        x = torch.randn(size // 4)
        methods_of_size = methods(len(x))
        for fn in methods_of_size.values():  # warm-up: connections, caches
            seconds(fn, x)
        for _ in range(repeats):  # rounds: all_reduce, ring, root, all_reduce, ...
            for name, fn in methods_of_size.items():
                report(name, seconds(fn, x), step=size)
        if rank == 0:  # alone: the others wait at the barrier below
            source, target = x.clone(), torch.empty_like(x)
            target.copy_(source)
            for _ in range(repeats):
                start = time.perf_counter()
                target.copy_(source)
                report("memcpy", time.perf_counter() - start, step=size)
        dist.barrier()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
