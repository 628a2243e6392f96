"""Rank 1's DataLoader worker (num_workers=1) raises on a corrupt record; the error reaches the
training loop wrapped ("Caught ValueError in DataLoader worker process 0 ..."). Rank 0 then fails
in its next all_reduce (a consequence)."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Records(Dataset):
    def __init__(self, corrupt: int | None):
        self.corrupt = corrupt

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.corrupt:
            raise ValueError(f"corrupt record {i}")
        return torch.ones(2)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for batch in DataLoader(Records(37 if rank == 1 else None), batch_size=8, num_workers=1):
        total = batch.sum()
        dist.all_reduce(total)
    dist.destroy_process_group()
