"""Rank 0 writes a checkpoint for longer than the group's timeout (5 s) before a barrier: rank 1
times out in the barrier while rank 0 is not in a collective. The checkpoint never ends (rank 0
is still writing it when the launcher ends it), so rank 1's timeout comes first however slow the
machine is."""
import datetime
import time

import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
dist.barrier()
if dist.get_rank() == 0:
    time.sleep(600)  # writing a checkpoint
dist.barrier()
dist.destroy_process_group()
