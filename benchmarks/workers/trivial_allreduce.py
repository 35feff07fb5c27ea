"""The smallest distributed job: join the process group, one all-reduce, leave. Run by torchrun."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
assert value.item() == dist.get_world_size()
dist.destroy_process_group()
