"""DDP823 (2 ranks): a parameter that never receives a gradient; the second iteration fails."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(4, 4)
        self.unused = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x)


model = DDP(TwoHeads())
for _ in range(2):
    model(torch.randn(2, 4)).sum().backward()
