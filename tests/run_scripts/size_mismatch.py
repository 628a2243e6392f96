"""The ranks all_reduce tensors of different lengths: 3 elements on rank 0, 4 on rank 1."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(3 + dist.get_rank())
dist.all_reduce(t)
dist.destroy_process_group()
