"""What the probes record for the sampler rules, in one fresh interpreter (this test process is never
patched) with a gloo group of one rank: which loaders fed the DDP model's training (a DDP forward
with autograd on, an optimizer step over a DDP model's parameters), which fed only a plain model or
no training at all, and accelerate's loader modes. accelerate is not a dependency: its shapes are
played by small stand-ins named Fake*, holding a real torch DataLoader as accelerate's do."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.procs import clean_env

pytestmark = pytest.mark.slow  # each test trains in a fresh interpreter (torch imported there)

SCRIPT = r'''
import json
import torch, torch.distributed as dist
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset
from ddp_doctor.training.probes.install import install

rec = install(None)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
ddp = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
ref = nn.Linear(4, 1)
opt_ddp = torch.optim.SGD(ddp.parameters(), lr=0.1)
opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)


def train(model, opt, loader, forward=None):
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss((forward or model)(x), y).backward()
        opt.step()


class FakeAccelerateBatchSamplerShard(BatchSampler):
    """accelerate's BatchSamplerShard(split_batches=True): each process keeps its slice of a batch."""
    def __init__(self, batch_sampler, num_processes=2, process_index=0):
        self.batch_sampler, self.batch_size, self.drop_last = batch_sampler, batch_sampler.batch_size, False
        self.num_processes, self.process_index, self.split_batches = num_processes, process_index, True

    def __iter__(self):
        n = self.batch_size // self.num_processes
        for b in self.batch_sampler:
            yield b[n * self.process_index:n * (self.process_index + 1)]

    def __len__(self):
        return len(self.batch_sampler)


class FakeAccelerateDataLoaderShard:
    """accelerate's DataLoaderShard (1.x): not a DataLoader; iterates the one it holds, one batch ahead."""
    def __init__(self, dataset, **kw):
        self.base_dataloader = DataLoader(dataset, **kw)

    def __iter__(self):
        it = self.base_dataloader.__iter__()
        current = next(it)
        for nxt in it:
            yield current
            current = nxt
        yield current


class FakeAccelerateDataLoaderDispatcher(FakeAccelerateDataLoaderShard):
    """accelerate's DataLoaderDispatcher: process 0 draws and broadcasts, then each keeps a slice."""
    split_batches = False

    def _fetch_batches(self, iterator):
        return next(iterator)

    def __iter__(self):
        it = self.base_dataloader.__iter__()
        while True:
            try:
                yield self._fetch_batches(it)
            except StopIteration:
                return


loaders = {
    "ddp": DataLoader(data, batch_size=8),
    "ref": DataLoader(data, batch_size=8, shuffle=True),
    "eval": DataLoader(data, batch_size=8),
    "module": DataLoader(data, batch_size=8),
    "split": FakeAccelerateDataLoaderShard(data, batch_sampler=FakeAccelerateBatchSamplerShard(
        BatchSampler(SequentialSampler(data), 8, False))),
    "dispatch": FakeAccelerateDataLoaderDispatcher(data, batch_size=8),
}
train(ddp, opt_ddp, loaders["ddp"])
train(ref, opt_ref, loaders["ref"])
with torch.no_grad():
    for x, _ in loaders["eval"]:
        ddp(x)
train(ddp, opt_ddp, loaders["module"], forward=ddp.module)  # around DDP, optimizer over its params
train(ddp, opt_ddp, loaders["split"])
train(ddp, opt_ddp, loaders["dispatch"])
out = rec.to_dict()
names = list(loaders)
print(json.dumps({"ddp_forwards": out["ddp_forwards"], "ddp_steps": out["ddp_steps"], "steps": out["steps"],
                  "loaders": {names[i]: ld for i, ld in enumerate(l for l in out["loaders"]
                                                                 if l["iterations"])}}))
dist.destroy_process_group()
'''


def test_probes_tell_ddp_training_from_reference_training_and_evaluation():
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=clean_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    lds = rec["loaders"]
    assert set(lds) == {"ddp", "ref", "eval", "module", "split", "dispatch"}

    def first(name: str) -> dict:
        return lds[name]["iterations"][0]
    # 4 batches per pass: ddp 4 forwards + 4 steps, module 4 steps, split 4 + 4, dispatch 4 + 4;
    # the reference model's steps and the no_grad evaluation forwards are not DDP training work.
    assert rec["steps"] == 20 and rec["ddp_steps"] == 16 and rec["ddp_forwards"] == 12
    assert first("ddp")["training"] and first("ddp")["ddp_training"]
    assert first("ref")["training"] and not first("ref")["ddp_training"]
    assert not first("eval")["training"] and not first("eval")["ddp_training"] and first("eval")["batches"] == 4
    assert first("module")["ddp_training"]
    split = lds["split"]
    assert split["wrapper"] == "FakeAccelerateDataLoaderShard" and split["split_batches"] and not split["dispatch"]
    assert split["distributed"] and first("split")["indices"][0] == [0, 1, 2, 3]
    assert first("split")["ddp_training"]
    dispatch = lds["dispatch"]
    assert dispatch["dispatch"] and dispatch["distributed"] and not dispatch["split_batches"]
    assert not lds["ddp"].get("wrapper") and not lds["ddp"]["split_batches"] and not lds["ddp"]["dispatch"]


COLLECTIVES_SCRIPT = r'''
import json
import torch, torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from ddp_doctor.training.probes.install import install
from ddp_doctor.training.probes.recorder import collectives_issued

rec = install(None)
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def train(loader, sync):
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        if sync:
            for p in model.parameters():
                dist.all_reduce(p.grad)
        opt.step()


before_group = collectives_issued()
train(DataLoader(data, batch_size=8), sync=False)          # no process group at all
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
train(DataLoader(data, batch_size=8), sync=False)          # a group that carries nothing
train(DataLoader(data, batch_size=8), sync=True)           # gradients all-reduced by hand
issued = collectives_issued()
ddp = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
out = rec.to_dict()
print(json.dumps({"before_group": before_group, "issued": issued, "ddp_models": out["ddp_models"],
                  "collectives": [ld["iterations"][0]["collectives"] for ld in out["loaders"] if ld["iterations"]]}))
dist.destroy_process_group()
'''


def test_probes_record_whether_collectives_ran_between_a_passes_draws():
    # What tells a model trained alone on each rank (no DDP, no collective: DDP855) from one whose
    # gradients are synchronised another way (FSDP, DeepSpeed, all_reduce by hand: DDP850 judged).
    out = subprocess.run([sys.executable, "-c", COLLECTIVES_SCRIPT], env=clean_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert rec["before_group"] == 0 and rec["issued"] == 8  # 4 batches x 2 parameters, by hand
    assert rec["collectives"] == [False, False, True]
    assert rec["ddp_models"] == 1
