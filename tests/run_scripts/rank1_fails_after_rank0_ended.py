"""Rank 0 ends well; rank 1 changes directory, keeps working, then fails on its own. The job
failed: the report (given as a relative path before the chdir) must say so, not rank 0's pass."""
import os
import sys
import tempfile
import time

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
dist.destroy_process_group()
if rank == 1:
    os.chdir(tempfile.mkdtemp())
    time.sleep(3)  # still working after rank 0 ended (the scenario, not a synchronisation)
    raise RuntimeError("disk quota exceeded while writing the last shard")
sys.exit(0)
