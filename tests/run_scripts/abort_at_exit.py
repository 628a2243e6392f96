"""A correct 2-rank job whose processes then abort during interpreter shutdown, the way torch 2.13's
gloo sometimes does after destroy_process_group (here made certain with an atexit os.abort())."""
import atexit
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
atexit.register(os.abort)
os.write(1, f"rank {os.environ['RANK']} done sum={t.item():g}\n".encode())
