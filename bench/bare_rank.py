"""The baseline rank: initialise a gloo process group from torchrun's environment, destroy it."""
import torch.distributed as dist

dist.init_process_group("gloo")
dist.destroy_process_group()
