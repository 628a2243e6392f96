"""Rank 1 raises; rank 0 then fails in its next collective (a consequence)."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise ValueError("bad batch on rank 1")
t = torch.ones(4)
dist.all_reduce(t)
dist.all_reduce(t)
