"""DDP826 (2 ranks): rank 1 is killed (SIGKILL, as the OOM killer does) during training; rank 0's
all_reduce then fails with gloo's "Connection closed by peer", a consequence."""
import os
import signal
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(4))
if dist.get_rank() == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
dist.all_reduce(torch.ones(4))
