import os
import sys

import torch
import torch.distributed as dist

from ddp_doctor.training import records

dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
# the job its preflight named (the reporting rank's token, sent with its verdict): one write, no interleaving
os.write(1, f"rank {dist.get_rank()} sum {t[0].item()} argv {sys.argv[1:]} job {records.current_job()}\n".encode())
dist.destroy_process_group()
