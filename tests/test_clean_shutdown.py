"""A small DDP script, shut down the way the lessons teach, exits cleanly every time.

Gloo processes that tear down the process group while a model still holds DDP's reducer (or
while a peer is still inside a collective) sometimes abort at exit with "terminate called
without an active exception", after printing their results. The lessons end every script with
a barrier, drop the model and optimizer, then destroy the process group; this test launches such
a script many times in a row and accepts no failure.
"""

from __future__ import annotations

from ddp_lib import launch

DDP_SCRIPT = """
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    print("done", flush=True)

    dist.barrier()           # nobody leaves while a peer is still inside a collective
    del model, optimizer     # release DDP's reducer before the process group goes away
    dist.destroy_process_group()
"""

RUNS = 20


def test_ddp_script_exits_cleanly_every_time(make_script):
    script = make_script("ddp_small.py", DDP_SCRIPT)
    results = [launch(script, nproc_per_node=2, timeout=180, stream=False, check=False)
               for _ in range(RUNS)]
    failures = [f"run {i}: exit {r.returncode}\n{r.output()[-2000:]}"
                for i, r in enumerate(results)
                if not r.ok or "terminate called" in r.output() or "done" not in r.output(1)]
    assert not failures, f"{len(failures)} of {RUNS} launches failed:\n" + "\n".join(failures)
