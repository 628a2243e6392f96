"""DDP827: DataLoader workers hand 4 MiB tensors back through /dev/shm; run it with a 1 MiB
/dev/shm (unshare --mount + tmpfs size=1m) and the workers cannot write their shared memory."""
import torch
from torch.utils.data import DataLoader, Dataset


class Big(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.ones(1024, 1024)


for batch in DataLoader(Big(), batch_size=1, num_workers=2):
    pass
