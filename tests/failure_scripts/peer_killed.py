"""DDP826 (2 ranks): rank 1 is killed (SIGKILL, as the OOM killer does) during training; rank 0's
all_reduce then fails with gloo's "Connection closed by peer", a consequence. The root cause is
rank 1, which left no Python error.

Rank 0 ignores SIGTERM only so that the launcher's clean-up of the surviving ranks (SIGTERM, sent
as soon as it sees rank 1 gone) cannot end it before its own error is recorded: gloo raises at once
when the peer's socket closes, so this only removes a race from the test."""
import os
import signal
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(4))
if dist.get_rank() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
dist.all_reduce(torch.ones(4))
