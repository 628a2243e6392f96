"""DDP891 (2 ranks): rank 1 is late for an all_reduce; rank 0's gloo collective times out (DDP825,
its consequence). The ledgers name rank 1, which never issued the call, and its line. Rank 1
never gets there (the launcher ends it once rank 0 failed), so what the report says does not
depend on how soon it would have."""
import time
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=2))
if dist.get_rank() == 1:
    time.sleep(600)
dist.all_reduce(torch.ones(4))
