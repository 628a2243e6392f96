import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
if dist.get_rank() == 1:
    time.sleep(600)
dist.all_reduce(t)
