"""The independent baseline for bench/comm.py: a minimal timed loop of dist.all_reduce, with no
ddp-doctor code. Launched by torchrun; rank 0 prints one JSON line {bytes: busbw_gbps}.

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/allreduce_loop.py \
        --sizes 16777216 67108864 --iters 20 --warmup 5
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--sizes", type=int, nargs="+", required=True)
ap.add_argument("--iters", type=int, default=20)
ap.add_argument("--warmup", type=int, default=5)
args = ap.parse_args()

dist.init_process_group("gloo")
n = dist.get_world_size()
out = {}
for nbytes in args.sizes:
    t = torch.ones(nbytes // 4)
    for _ in range(args.warmup):
        dist.all_reduce(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(t)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time
    seconds = elapsed.item() / args.iters
    out[nbytes] = nbytes / seconds / 1e9 * 2 * (n - 1) / n
if dist.get_rank() == 0:
    print(json.dumps(out), flush=True)
dist.destroy_process_group()
os._exit(0)  # torch 2.13's gloo may abort in static destructors at interpreter exit
