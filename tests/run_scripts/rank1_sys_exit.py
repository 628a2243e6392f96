"""Rank 1 ends its script with sys.exit(3) at step 2 (a condition only it met: its data ran out),
while rank 0 goes on to its next all_reduce: rank 0's lost-peer error, or the launcher's stop, is
the consequence. The cause is rank 1's exit."""
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for step in range(5):
    t = torch.ones(2)
    dist.all_reduce(t)
    if dist.get_rank() == 1 and step == 2:
        print("rank 1: no more data, stopping", flush=True)
        sys.exit(3)
dist.destroy_process_group()
