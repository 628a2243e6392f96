"""Rank 1 ends (exit status 0) without ever calling init_process_group, while rank 0 waits in
its init (8 s timeout) for it: rank 0's init times out. The cause is rank 1, which ended without
calling init_process_group while rank 0 waited for it."""
import datetime
import os

import torch
import torch.distributed as dist

if os.environ["RANK"] != "1":
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=8))
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
