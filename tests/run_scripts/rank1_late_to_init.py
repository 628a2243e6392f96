"""Rank 1 does slow per-rank work before init_process_group (tokenizing its shard, a download:
here a 30 s sleep), longer than init's 8 s timeout, so rank 0's init times out waiting for it.
The cause is rank 1, at its sleep; rank 0's store timeout is the consequence."""
import datetime
import os
import time

import torch
import torch.distributed as dist

if os.environ["RANK"] == "1":
    time.sleep(30)  # the slow per-rank work before init
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=8))
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
