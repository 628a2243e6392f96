"""An all_reduce inside `if rank == 0:`, then a barrier on every rank: the collectives differ."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(2))
dist.barrier()
dist.destroy_process_group()
