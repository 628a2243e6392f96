"""Training ends well on every rank; then rank 1 fails on its own, after the process group is
destroyed (saving a checkpoint, say), while rank 0 has nothing left to do."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
rank = dist.get_rank()
dist.destroy_process_group()
if rank == 1:
    raise OSError("No space left on device while writing checkpoint-final.pt")
print(f"rank {rank} done")
