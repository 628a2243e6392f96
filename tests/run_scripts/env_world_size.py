"""The script sets WORLD_SIZE=4 before init while the launcher started 2 ranks."""
import os

import torch.distributed as dist

os.environ["WORLD_SIZE"] = "4"
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
