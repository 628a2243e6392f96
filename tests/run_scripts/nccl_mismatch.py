"""Two NCCL ranks (one GPU each): rank 0 issues an extra all_reduce that rank 1 never issues; rank 1
is elsewhere (sleeping, not in a collective). With a 10 s group timeout NCCL's watchdog on rank 0
times out, dumps the flight recorder of every rank (TORCH_NCCL_DUMP_ON_TIMEOUT, which `ddp-doctor
run` sets, into its run directory), then aborts rank 0 (SIGABRT). The report should name rank 1 as
the cause (DDP891: it never issued all_reduce #3) or the call that differs (DDP890), with the
dumps as evidence. Run by scripts/gpu-smoke.sh on hosts with 2 GPUs or more."""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", timeout=timedelta(seconds=10))
a = torch.ones(3, 4, device="cuda")
for _ in range(2):
    dist.all_reduce(a)
torch.cuda.synchronize()
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(4, 5, device="cuda"))  # rank 1 never issues this one
    torch.cuda.synchronize()  # waits until the watchdog aborts the process
else:
    time.sleep(300)  # elsewhere: not in a collective while rank 0 waits
dist.destroy_process_group()
