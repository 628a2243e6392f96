"""In-process A/B of the probes' cost on the same training, for bench/overhead.py.

One process, a world of one (gloo, HashStore), a DDP MLP fed by a DistributedSampler DataLoader.
Epochs rotate between three variants: probes off (the original torch functions put back and no
recorder), probes on as in a first epoch (the loader's history emptied first, so the epoch pays the
fingerprints of 8 batches and a record flush: the worst case, paid in the first 4 epochs of each
loader), and probes on in the steady state (4 epochs already kept: only the per-batch wrappers and
the step hook). Same model, data and process, so machine load hits all alike. Prints the minimum
epoch time of each variant over --pairs rounds (the minimum is what load does not inflate), and the
same in the main thread's CPU time (time.thread_time: the probes run in the training's own thread,
and a busy machine does not move it), from which the probes' CPU per step follows.
"""
import argparse
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter
from torch.utils.data.distributed import DistributedSampler

from ddp_doctor.training.probes import dist_wrappers, fingerprints, loader_wrappers, recorder
from ddp_doctor.training.probes.install import install

ap = argparse.ArgumentParser()
ap.add_argument("--pairs", type=int, default=20)
ap.add_argument("--epoch-steps", type=int, default=100)
ap.add_argument("--batch-size", type=int, default=32)
args = ap.parse_args()

torch.set_num_threads(1)
rec = install(tempfile.mkdtemp(prefix="ddp-bench-probes-"))
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
WRAPPED = [(owner, name, getattr(owner, name)) for owner, name in (
    (_BaseDataLoaderIter, "__next__"), (_BaseDataLoaderIter, "_next_index"), (DataLoader, "__iter__"),
    (DistributedSampler, "set_epoch"))]


def variant(name: str) -> None:
    on = name != "off"
    for owner, attr, wrapper in WRAPPED:
        setattr(owner, attr, wrapper if on else wrapper._ddp_doctor_orig)
    recorder._current = rec if on else None  # the step hook and the other wrappers record nothing
    for its in rec.iterations.values():
        if name == "first":
            its.clear()  # a "first" epoch: fingerprints + flush
        elif name == "steady" and its:
            its.extend([its[0]] * (loader_wrappers.MAX_ITERATIONS - len(its)))  # enough kept: wrappers only


n = args.epoch_steps * args.batch_size
x = torch.randn(n, 256)
y = torch.randint(0, 10, (n,))
data = TensorDataset(x, y)
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
epoch = 0


def one_epoch() -> tuple[float, float]:
    """(wall s, the main thread's CPU s) of one epoch."""
    global epoch
    sampler.set_epoch(epoch)
    epoch += 1
    t, c = time.perf_counter(), time.thread_time()
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    return time.perf_counter() - t, time.thread_time() - c


one_epoch()  # warm-up, probes on: the first step's checksum is taken here
order = ["off", "first", "steady"]
times: dict[str, list[float]] = {v: [] for v in order}
cpu: dict[str, list[float]] = {v: [] for v in order}
for i in range(args.pairs):
    for name in order[i % 3:] + order[:i % 3]:
        variant(name)
        wall, used = one_epoch()
        times[name].append(wall)
        cpu[name].append(used)

# The steady-state cost at a finer grain than an epoch's noise: batches of one empty sample, so the
# wrappers are most of what is timed, and the step hook called alone.
tiny_data = TensorDataset(torch.zeros(4000, 1))
tiny = DataLoader(tiny_data, batch_size=1, sampler=DistributedSampler(tiny_data, shuffle=True, seed=0))
per_batch: dict[str, list[float]] = {"off": [], "steady": []}
per_batch_cpu: dict[str, list[float]] = {"off": [], "steady": []}
for i in range(args.pairs):
    for name in (("off", "steady") if i % 2 == 0 else ("steady", "off")):
        variant(name)
        t, c = time.perf_counter(), time.thread_time()
        k = sum(1 for _ in tiny)
        per_batch[name].append((time.perf_counter() - t) / k)
        per_batch_cpu[name].append((time.thread_time() - c) / k)
variant("steady")
t, c = time.perf_counter(), time.thread_time()
for _ in range(20000):
    dist_wrappers.on_optimizer_step(opt)
hook = (time.perf_counter() - t) / 20000
hook_cpu = (time.thread_time() - c) / 20000


def best(f, n: int) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        out.append(time.perf_counter() - t)
    return min(out)


batch = next(iter(loader))
hash_s = best(lambda: fingerprints.sample_hashes(batch, args.batch_size), 50)  # one batch's contents
flush_s = best(rec.flush, 20)  # the record written once, at the first epoch's 8th batch
dist.destroy_process_group()
print(f"epoch_s_off={min(times['off']):.6f} epoch_s_first={min(times['first']):.6f} "
      f"epoch_s_steady={min(times['steady']):.6f} steps={args.epoch_steps} "
      f"batch_us_off={min(per_batch['off']) * 1e6:.3f} batch_us_on={min(per_batch['steady']) * 1e6:.3f} "
      f"hook_us={hook * 1e6:.3f} hash_ms={hash_s * 1e3:.4f} flush_ms={flush_s * 1e3:.4f}", flush=True)
print(f"cpu_epoch_s_off={min(cpu['off']):.6f} cpu_epoch_s_first={min(cpu['first']):.6f} "
      f"cpu_epoch_s_steady={min(cpu['steady']):.6f} cpu_batch_us_off={min(per_batch_cpu['off']) * 1e6:.3f} "
      f"cpu_batch_us_on={min(per_batch_cpu['steady']) * 1e6:.3f} cpu_hook_us={hook_cpu * 1e6:.3f}", flush=True)
