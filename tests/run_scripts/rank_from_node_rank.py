"""The global rank computed as node index x processes per node + local rank, with the node index
read from NODE_RANK, which torchrun does not set for its workers (it sets GROUP_RANK): every node
computes node 0's ranks, so on two nodes of one process each both processes claim rank 0."""
import os

import torch.distributed as dist

node = int(os.environ.get("NODE_RANK", 0))
rank = node * int(os.environ["LOCAL_WORLD_SIZE"]) + int(os.environ["LOCAL_RANK"])
dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
dist.barrier()
dist.destroy_process_group()
