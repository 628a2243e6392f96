"""Run with 2 ranks: rank 1's preprocessing waits for data rank 0 publishes only after the monitored
barrier (a key in the job's store; the wait bounded at 60 s), so rank 0's monitored_barrier (3 s)
raises, naming rank 1, and the launcher then stops rank 1 where it waits."""
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_store

dist.init_process_group("gloo")
store = _get_default_store()
if dist.get_rank() == 1:
    store.wait(["vocabulary"], timedelta(seconds=60))  # its preprocessing: waits for rank 0's data
dist.monitored_barrier(timeout=timedelta(seconds=3))
if dist.get_rank() == 0:
    store.set("vocabulary", "built")
dist.destroy_process_group()
