"""Rank 0 all-reduces 4 floats, rank 1 five: with TORCH_DISTRIBUTED_DEBUG=DETAIL torch compares the
collectives first and raises "Detected mismatch between collectives on ranks" on both (DDP842)."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4 if dist.get_rank() == 0 else 5)
dist.all_reduce(t)
dist.destroy_process_group()
