"""Rank 0 deletes ddp-doctor's run directory, then rank 1 blocks outside any collective while
rank 0 waits in one: a hang, after the records' directory is gone."""
import os
import shutil
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
if dist.get_rank() == 0:
    run_dir = os.environ["DDP_DOCTOR_PROBE_DIR"]  # this job's run directory, whoever made it
    for _ in range(50):  # a watchdog may add a file while it is removed: try again
        shutil.rmtree(run_dir, ignore_errors=True)
        if not os.path.exists(run_dir):
            break
    os.write(2, f"deleted {run_dir}\n".encode())
dist.barrier()
if dist.get_rank() == 1:
    time.sleep(600)
dist.all_reduce(t)
