"""The same job as trivial_allreduce.py, started by torch.multiprocessing.spawn instead of torchrun.

Usage: python spawn_allreduce.py NPROCS
"""
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def work(rank: int, world_size: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    value = torch.ones(1)
    dist.all_reduce(value)
    assert value.item() == world_size
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    nprocs = int(sys.argv[1])
    mp.spawn(work, args=(nprocs, free_port()), nprocs=nprocs)
