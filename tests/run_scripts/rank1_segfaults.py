import ctypes

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1:
    ctypes.string_at(0)  # reads address 0: SIGSEGV inside native code
dist.barrier()
dist.destroy_process_group()
