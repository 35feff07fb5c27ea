"""Training throughput of one process and of DDP variants, measured in one run.

Run by torchrun with 2 (or more) processes, one thread each:
    python -m torch.distributed.run --nproc-per-node=2 train_throughput.py --model resnet18

Every round runs each variant for a few steps, so a load change on a shared machine hits all of
them alike (A B C A B C ...):

* ``solo 1 thread`` / ``solo N threads``: rank 0 trains a plain model alone, with 1 thread on
  the per-rank batch and with N threads on the global batch, while the other ranks wait
  in a blocking receive (their CPU use meanwhile is reported: it should be ~0, else they take
  a core the N-thread run needs);
* ``ddp``: DistributedDataParallel as the lessons use it (25 MB buckets, all-reduce in fp32);
* ``ddp no_sync``: the same with gradient communication switched off, the upper bound;
* ``ddp fp16`` / ``ddp bf16``: gradients compressed to 16 bits by DDP's communication hooks;
* ``ddp powerSGD``: low-rank gradient compression (rank 1, after 2 plain steps);
* ``ddp bucket 100MB``: fewer, larger all-reduces than the default 25 MB buckets.

With ``--accuracy`` it instead trains the small CNN on the course's data set once per gradient
format (fp32, fp16, bf16, powerSGD) from the same start and reports the test accuracy.
Rank 0 reports images/s per round (ddp_lib.metrics); the data-loading cost is measured apart.
"""
import argparse
import copy
import time

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before init_process_group: see the README
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from torchvision import transforms

from ddp_lib import data
from ddp_lib.metrics import report
from ddp_lib.models import SmallCNN, resnet18_cifar

MODELS = {"smallcnn": SmallCNN, "resnet18": resnet18_cifar}


def ddp_model(model, variant):
    """A DDP wrapper of a copy of ``model`` configured as ``variant`` says."""
    bucket_cap_mb = 100 if variant == "ddp bucket 100MB" else 25
    wrapped = DDP(copy.deepcopy(model), bucket_cap_mb=bucket_cap_mb)
    if variant == "ddp fp16":
        wrapped.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif variant == "ddp bf16":
        wrapped.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif variant == "ddp powerSGD":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2, min_compression_rate=2)
        wrapped.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return wrapped


def train_steps(model, optimizer, images, labels, steps, sync=True):
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        if sync:
            loss.backward()
        else:
            with model.no_sync():
                loss.backward()
        optimizer.step()


def throughput(args, world_size, rank):
    torch.manual_seed(0)
    base = MODELS[args.model]()
    batch = args.batch_size
    images, labels = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    big_images, big_labels = torch.randn(batch * world_size, 3, 32, 32), torch.randint(
        0, 10, (batch * world_size,))
    variants = ["solo 1 thread", f"solo {world_size} threads", "ddp", "ddp no_sync", "ddp fp16",
                "ddp bf16", "ddp powerSGD", "ddp bucket 100MB"]
    models, optimizers = {}, {}
    for variant in variants:
        model = copy.deepcopy(base) if variant.startswith("solo") else ddp_model(base, variant)
        models[variant] = model
        optimizers[variant] = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def run(variant, steps):
        """Seconds rank 0 took for ``steps`` steps of ``variant`` (None on other ranks)."""
        model, optimizer = models[variant], optimizers[variant]
        dist.barrier()
        if variant.startswith("solo"):
            if rank == 0:
                threads = 1 if variant == "solo 1 thread" else world_size
                torch.set_num_threads(threads)
                x, y = (images, labels) if threads == 1 else (big_images, big_labels)
                start = time.perf_counter()
                train_steps(model, optimizer, x, y, steps)
                elapsed = time.perf_counter() - start
                torch.set_num_threads(1)
                for other in range(1, world_size):
                    dist.send(torch.zeros(1), other)  # you may go on
                return elapsed, len(x) * steps
            cpu, wall = time.process_time(), time.perf_counter()
            dist.recv(torch.zeros(1), 0)  # a blocking receive sleeps; rank 0 needs the cores
            report("waiting_cpu_fraction", (time.process_time() - cpu)
                   / (time.perf_counter() - wall), step=0, variant=variant)
            return None
        start = time.perf_counter()
        train_steps(model, optimizer, images, labels, steps, sync=variant != "ddp no_sync")
        return time.perf_counter() - start, batch * world_size * steps

    for variant in variants:  # warm-up: allocations, DDP's first bucket rebuild, PowerSGD start
        run(variant, args.warmup)
    for round_index in range(args.rounds):
        for variant in variants:
            measured = run(variant, args.steps)
            if measured and rank == 0:
                seconds, count = measured
                report("images_per_s", count / seconds, step=round_index, variant=variant)
    if rank == 0:
        loading_cost(batch)


def loading_cost(batch):
    """Images/s of the input pipeline alone: PIL decoding + transforms, and pre-decoded tensors."""
    normalize = transforms.Compose([transforms.ToTensor(),
                                    transforms.Normalize(data.CIFAR10_MEAN, data.CIFAR10_STD)])
    dataset = data.cifar10(train=True, transform=normalize)
    tensors = as_tensors(data.cifar10(train=True), len(dataset))
    for name, source in (("loader PIL + transforms", dataset), ("loader pre-decoded", tensors)):
        loader = iter(DataLoader(source, batch_size=batch, shuffle=True))
        next(loader)
        batches = 10
        start = time.perf_counter()
        for _ in range(batches):
            next(loader)
        report("images_per_s", batch * batches / (time.perf_counter() - start), step=0,
               variant=name)


def as_tensors(dataset, limit):
    """Decode and normalise the images once (as lessons 01 and 05 do)."""
    x = torch.from_numpy(dataset.data[:limit]).permute(0, 3, 1, 2).float().div(255)
    mean = torch.tensor(data.CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(data.CIFAR10_STD).view(1, 3, 1, 1)
    return TensorDataset((x - mean) / std, torch.tensor(dataset.targets[:limit]))


def accuracy(args, world_size, rank):
    """Test accuracy after the same short training with each gradient format."""
    train_set = as_tensors(data.cifar10(train=True), args.train_samples)
    test_set = as_tensors(data.cifar10(train=False), args.test_samples)
    for variant in ("ddp", "ddp fp16", "ddp bf16", "ddp powerSGD"):
        torch.manual_seed(0)
        model = ddp_model(SmallCNN(), variant)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        sampler = DistributedSampler(train_set, seed=0)
        loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for images, labels in loader:
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(model(images), labels).backward()
                optimizer.step()
        model.eval()
        with torch.no_grad():
            x, y = test_set.tensors
            correct = torch.tensor([(model.module(x).argmax(1) == y).float().mean().item()])
        dist.all_reduce(correct)  # the same on every rank (identical weights); checked below
        if rank == 0:
            report("test_accuracy", correct.item() / world_size, step=args.epochs,
                   variant=variant)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    parser.add_argument("--batch-size", type=int, default=64)  # per process
    parser.add_argument("--steps", type=int, default=2)  # per variant and round
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--accuracy", action="store_true")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--train-samples", type=int, default=4000)
    parser.add_argument("--test-samples", type=int, default=1000)
    args = parser.parse_args()

    torch.set_num_threads(1)  # one thread per rank; the solo variants set their own
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        data.prepare_cifar10(verbose=False)
    dist.barrier()
    if args.accuracy:
        accuracy(args, world_size, rank)
    else:
        throughput(args, world_size, rank)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
