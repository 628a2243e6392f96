"""DDP's errors about single parameters, on 2 gloo ranks (tests/training/test_ddp_parameters_e2e.py).

`head`: a head never used in forward, on every rank: both ranks' second forward raises "Expected to
have finished reduction in the prior iteration" for the head's parameters, indices 5 and 6 (before
them: trunk.weight, trunk.bias, tied.bias, shared.weight, shared.bias; `tied` shares trunk's weight,
counted once, and `frozen` requires no grad, not counted).
`branch`: rank 1 skips the `extra` branch (indices 2-5): only rank 1's iteration leaves parameters
unused; rank 0 fails after it (its peer is gone).
`twice`: a block checkpointed twice in reentrant mode: "Expected to mark a variable ready only
once" for the block's parameters.
"""
import sys

import torch
import torch.distributed as dist
import torch.utils.checkpoint as cp
from torch.nn.parallel import DistributedDataParallel as DDP

MODE = sys.argv[1]
dist.init_process_group("gloo")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(4, 4)
        self.frozen = torch.nn.Linear(4, 4).requires_grad_(False)
        self.tied = torch.nn.Linear(4, 4)
        self.tied.weight = self.trunk.weight  # shared: DDP reduces it once
        self.shared = torch.nn.Linear(4, 4)
        self.unused_head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.shared(self.trunk(x) + self.tied(x) + self.frozen(x))


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(4, 4)
        self.extra = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
        self.out = torch.nn.Linear(4, 1)

    def forward(self, x, take):
        h = self.trunk(x)
        if take:
            h = self.extra(h)
        return self.out(h)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


class Checkpointed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Linear(4, 4)
        self.block = Block()

    def forward(self, x):
        h = self.pre(x)
        h = cp.checkpoint(self.block, h, use_reentrant=True)
        return cp.checkpoint(self.block, h, use_reentrant=True)


if MODE == "head":
    model = DDP(Net())
    step = lambda: model(torch.randn(2, 4))  # noqa: E731
elif MODE == "branch":
    model = DDP(Branchy())
    step = lambda: model(torch.randn(2, 4), dist.get_rank() == 0)  # noqa: E731
else:
    model = DDP(Checkpointed())
    step = lambda: model(torch.randn(2, 4, requires_grad=True))  # noqa: E731
for _ in range(3):
    step().sum().backward()
dist.destroy_process_group()
