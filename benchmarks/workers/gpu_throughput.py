"""One device: ResNet-18 images/s of the plain model and of 1-process DDP, in fp32.

The lessons have no script that trains the plain (unwrapped) model, so DDP's own cost on one
GPU is measured here; the AMP comparison runs lesson 07's ``train_amp_speed.py`` instead.

Run by torchrun with one process: python -m torch.distributed.run --nproc-per-node=1
    gpu_throughput.py [--steps 20]
On a CUDA GPU it uses cuda:0 and NCCL; without one it runs the same code on the CPU with Gloo
(slowly: a check that the code runs, not a measurement). Variants run in interleaved rounds;
rank 0 reports images/s per round.

Every variant runs the same loop on the same GPU-resident batch. DDP's wrapper is compared twice:
with its defaults, and as the lessons use it on one GPU, with ``gradient_as_bucket_view=True``
(gradients live in the all-reduce buckets; ``zero_grad(set_to_none=False)`` keeps them there, so
no per-parameter copy into a bucket at every step) and ``static_graph=True`` (valid here: every
step uses every parameter the same way).
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from course_helpers import report, resnet18_cifar


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)  # per variant and round
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)  # per variant, not measured
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    dist.init_process_group("nccl" if cuda else "gloo")
    images = torch.randn(args.batch_size, 3, 32, 32, device=device)
    labels = torch.randint(0, 10, (args.batch_size,), device=device)

    torch.manual_seed(0)
    models = {"fp32": resnet18_cifar().to(device),
              "ddp 1 process fp32, defaults": DDP(resnet18_cifar().to(device)),
              "ddp 1 process fp32": DDP(resnet18_cifar().to(device), gradient_as_bucket_view=True,
                                        static_graph=True)}
    optimizers = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
                  for k, m in models.items()}

    def run(variant, steps):
        model, optimizer = models[variant], optimizers[variant]
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=False)  # the same in every variant
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        return args.batch_size * steps / (time.perf_counter() - start)

    for variant in models:  # warm-up: cuDNN autotuning, allocations, DDP's first-step set-up
        run(variant, args.warmup)
    for round_index in range(args.rounds):
        for variant in models:
            report("images_per_s", run(variant, args.steps), step=round_index, variant=variant,
                   device=str(device))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
