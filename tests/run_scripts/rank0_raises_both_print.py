"""Both ranks print on stdout and stderr (and which sys.excepthook they start with), meet, then
rank 0 raises and rank 1 ends well. Under `--local-ranks-filter 0` only rank 0's lines show, its
traceback labelled "[rank0]: " by torch's init_process_group, as under torchrun."""
import os
import sys

import torch.distributed as dist

rank = os.environ["RANK"]
print(f"rank {rank} out, excepthook before init: {sys.excepthook.__name__}", flush=True)
print(f"rank {rank} err", file=sys.stderr, flush=True)
dist.init_process_group("gloo")
dist.barrier()  # both ranks have printed: rank 1's lines were filtered, not yet to come
if dist.get_rank() == 0:
    raise ValueError("rank 0 fails on purpose")
