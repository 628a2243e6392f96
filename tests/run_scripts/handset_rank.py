"""init_process_group with rank=0 and world_size=2 written by hand: every rank passes rank 0."""
import torch.distributed as dist

dist.init_process_group("gloo", rank=0, world_size=2)
dist.barrier()
dist.destroy_process_group()
