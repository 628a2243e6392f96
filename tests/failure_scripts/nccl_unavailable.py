"""DDP840: the nccl backend with a torch build (or host) that has no NCCL."""
import os
import tempfile

import torch.distributed as dist

path = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group("nccl", init_method=f"file://{path}", rank=0, world_size=1)
