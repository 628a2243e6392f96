"""DDP836 (2 ranks): each rank builds a differently sized model; DDP's construction check fails."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
hidden = 8 if dist.get_rank() == 0 else 16
DDP(torch.nn.Linear(4, hidden))
