"""The rank named by OOM_RANK is killed by SIGKILL in the middle of training, as the kernel's OOM
killer does: it leaves no record. The others then fail in their next all_reduce."""
import os
import signal

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(6):
    if step == 3 and rank == int(os.environ["OOM_RANK"]):
        os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer
    t = torch.ones(4)
    dist.all_reduce(t)
dist.destroy_process_group()
