"""Run with 2 ranks: rank 1 spends longer on its preprocessing than the monitored barrier after
it waits (3 s), so rank 0's monitored_barrier raises, naming rank 1."""
import time
from datetime import timedelta

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(8)  # its preprocessing
dist.monitored_barrier(timeout=timedelta(seconds=3))
dist.destroy_process_group()
