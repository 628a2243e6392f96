"""Rank 1 calls init_process_group 2 s after rank 0 (slow per-rank work, well within init's 20 s
timeout): a correct job that must stay clean (no finding about a late rank)."""
import datetime
import os
import time

import torch
import torch.distributed as dist

if os.environ["RANK"] == "1":
    time.sleep(2)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == 2.0
dist.destroy_process_group()
