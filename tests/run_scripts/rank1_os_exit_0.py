"""Run with 2 ranks: rank 1 stops early with os._exit(0) (an "early stop" that skips the cleanup)
while rank 0 goes on; rank 0's next all_reduce then fails with "Connection closed by peer", the
only error printed, and the launcher counts rank 1 as a rank that finished."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(8)
for step in range(6):
    dist.all_reduce(x)
    if rank == 1 and step == 2:
        os._exit(0)
dist.destroy_process_group()
