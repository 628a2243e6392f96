"""The global rank taken from the per-node index (LOCAL_RANK): on two nodes of one process each,
both processes claim rank 0. With --right, the launcher's RANK: the job forms."""
import os
import sys

import torch.distributed as dist

rank = int(os.environ["RANK" if "--right" in sys.argv else "LOCAL_RANK"])
dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
dist.barrier()
dist.destroy_process_group()
