"""The training that bench/overhead.py measures: a plain DDP loop (an MLP on synthetic data read
through a DistributedSampler DataLoader, SGD, several epochs with set_epoch) that times its own
steady-state steps. After --warmup steps the ranks meet at a barrier and the clock starts; it
stops after the last step. Rank 0 prints one line (elapsed is the slowest rank's):

    steps_per_second=212.31 median_step_ms=4.61 cpu_ms_per_step=4.52 steps=450 step_ms_range=4.02-31.5

cpu_ms_per_step is rank 0's CPU time (all its threads: the probes' watchdog included) per timed
step: less sensitive than wall time to other processes on the machine.

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/_train_loop.py
    python -m ddp_doctor run --nproc-per-node 2 bench/_train_loop.py
    python bench/_train_loop.py [--probe-dir DIR]   # one process: a world of one over a HashStore

--probe-dir installs ddp-doctor's probes in this process before anything else, recording to DIR,
as `ddp-doctor run` does before it starts the script, but without its preflight, watchdog thread
and parent process.
"""
import argparse
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=500, help="optimizer steps in all, warm-up included")
ap.add_argument("--warmup", type=int, default=50, help="first steps left out of the timing")
ap.add_argument("--batch-size", type=int, default=32, help="per rank")
ap.add_argument("--features", type=int, default=256)
ap.add_argument("--hidden", type=int, default=512)
ap.add_argument("--epoch-steps", type=int, default=100, help="steps per epoch and rank (data set size)")
ap.add_argument("--probe-dir", default=None, help="install ddp-doctor's probes, recording here")
args = ap.parse_args()
if not 1 <= args.warmup < args.steps:
    sys.exit("need 1 <= --warmup < --steps")

if args.probe_dir:
    from ddp_doctor.training.probes.install import install
    os.makedirs(args.probe_dir, exist_ok=True)
    install(args.probe_dir)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

if "WORLD_SIZE" in os.environ:
    dist.init_process_group("gloo")
else:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
n = args.epoch_steps * args.batch_size * world
x = torch.randn(n, args.features)
y = torch.randint(0, 10, (n,))
sampler = DistributedSampler(TensorDataset(x, y), shuffle=True, seed=0)
loader = DataLoader(sampler.dataset, batch_size=args.batch_size, sampler=sampler, num_workers=0)
model = DDP(nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()

step, epoch, start, cpu = 0, 0, 0.0, 0.0
stamps: list[float] = []
while step < args.steps:
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(xb), yb).backward()
        opt.step()
        step += 1
        if step == args.warmup:
            dist.barrier()
            start, cpu = time.perf_counter(), time.process_time()
            stamps.append(start)
        elif step > args.warmup:
            stamps.append(time.perf_counter())
        if step == args.steps:
            break
    epoch += 1

cpu = time.process_time() - cpu
elapsed = torch.tensor([stamps[-1] - start], dtype=torch.float64)
dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
if rank == 0:
    gaps = [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])]
    print(f"steps_per_second={(args.steps - args.warmup) / elapsed.item():.3f} "
          f"median_step_ms={statistics.median(gaps):.4f} cpu_ms_per_step={cpu * 1e3 / len(gaps):.4f} "
          f"steps={len(gaps)} "
          f"step_ms_range={min(gaps):.2f}-{max(gaps):.1f}", flush=True)
dist.destroy_process_group()
if "ddp_doctor.training.run.watched_rank" not in sys.modules:
    # No ddp-doctor wrapper that ends this process after its own records: end without interpreter
    # teardown, where torch 2.13's gloo may abort in static destructors.
    sys.stdout.flush()
    os._exit(0)
