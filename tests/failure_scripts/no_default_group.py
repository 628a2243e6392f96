"""DDP833: a collective before init_process_group."""
import torch
import torch.distributed as dist

dist.all_reduce(torch.ones(1))
