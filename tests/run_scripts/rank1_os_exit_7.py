"""Rank 1 leaves with os._exit(7) at step 2 (no Python error, no ending recorded: as a native
library's exit would), while rank 0 goes on to its next all_reduce: rank 0's lost-peer error
("Connection closed by peer", exit 1) is the consequence, and may be recorded first. The job's
status is rank 1's own, 7."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for step in range(50):
    t = torch.ones(2)
    dist.all_reduce(t)
    if dist.get_rank() == 1 and step == 2:
        os._exit(7)
dist.destroy_process_group()
