"""Rank 0 ends well; rank 1 changes directory, keeps working until rank 0's process is gone, then
fails on its own. The job failed: the report (given as a relative path before the chdir) must say
so, not rank 0's pass."""
import os
import sys
import tempfile
import time

import torch.distributed as dist

from ddp_doctor.training.run.ledger import process_gone

dist.init_process_group("gloo")
rank = dist.get_rank()
pids = [None, None]
dist.all_gather_object(pids, os.getpid())
dist.barrier()
dist.destroy_process_group()
if rank == 1:
    os.chdir(tempfile.mkdtemp())
    deadline = time.monotonic() + 120  # still working after rank 0 ended: when it has, not a guess
    while not process_gone(pids[0]):
        if time.monotonic() > deadline:
            raise TimeoutError("rank 0's process never ended")
        time.sleep(0.05)
    raise RuntimeError("disk quota exceeded while writing the last shard")
sys.exit(0)
