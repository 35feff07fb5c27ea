# GPUs were asked for: a rank that sees none stops, and never trains on the CPU.
export DDP_BACKEND=nccl
