"""A plain PyTorch DDP training loop: the correct recipe, small enough to read in one sitting.

    python -m ddp_doctor.training.plain_loop                                  # one process
    torchrun --standalone --nproc-per-node 2 -m ddp_doctor.training.plain_loop --epochs 3
    ddp-doctor run --nproc-per-node 2 -m ddp_doctor.training.plain_loop

The recipe:

1. ``init_process_group`` from the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):
   nccl with ``torch.cuda.set_device(LOCAL_RANK)`` when there are GPUs, gloo on CPU;
2. the model moved to its device and wrapped in ``DistributedDataParallel`` (``device_ids`` only on CUDA);
3. a map-style data set read through a ``DistributedSampler``, with ``sampler.set_epoch(epoch)`` every
   epoch so that each epoch has a new order and every rank its own share;
4. the checkpoint written by rank 0 only (``model.module.state_dict()``), the others wait at a barrier;
5. ``destroy_process_group`` at the end, also when training raised.

Without a launcher (WORLD_SIZE unset) the script still runs the same code path, as a world of one: the
process group is made with an in-process ``HashStore``, so no port is needed and none can clash.

Hyperparameters are command-line arguments (``--epochs``, ``--batch-size``, ``--lr``, ``--seed``,
``--num-samples``); the checkpoint goes to ``--model-dir`` (default ``$SM_MODEL_DIR`` or ``./model``),
as ``model.pt``. Rank 0 prints one line an epoch and a final summary.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddp_doctor.training.plain_loop",
                                description="Plain-loop DDP example (CPU/gloo or GPU/nccl).")

    def add(name: str, **kw) -> None:
        names = [name] + (["--" + name[2:].replace("-", "_")] if "-" in name[2:] else [])
        p.add_argument(*names, **kw)

    add("--epochs", type=int, default=3)
    add("--batch-size", type=int, default=32, help="per-rank batch size")
    add("--lr", type=float, default=0.05)
    add("--seed", type=int, default=0)
    add("--num-samples", type=int, default=512, help="size of the synthetic data set")
    add("--model-dir", default=os.environ.get("SM_MODEL_DIR") or "./model",
        help="where rank 0 writes model.pt (default $SM_MODEL_DIR or ./model)")
    add("--backend", default=None, help="process group backend (default: nccl with GPUs, else gloo)")
    add("--timeout", type=float, default=600.0, help="process group timeout, seconds")
    return p


class Regression(Dataset):
    """Deterministic map-style data set: y = x . w + noise, the same on every rank."""

    def __init__(self, n: int, dim: int = 8, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        w = torch.randn(dim, 1, generator=g)
        self.y = self.x @ w + 0.01 * torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def setup(backend: str | None, timeout: float) -> tuple[int, int, torch.device]:
    """Initialise the default process group; return (rank, world_size, device)."""
    cuda = torch.cuda.is_available()
    backend = backend or ("nccl" if cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)  # before init: each rank owns its own GPU
        device = torch.device("cuda", local_rank)
    kw = {"backend": backend, "timeout": timedelta(seconds=timeout)}
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(init_method="env://", **kw)  # torchrun, SageMaker, ddp-doctor run
    else:
        dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1, **kw)  # no launcher
    return dist.get_rank(), dist.get_world_size(), device


def train(args: argparse.Namespace, rank: int, world_size: int, device: torch.device) -> dict:
    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    data = Regression(args.num_samples, seed=args.seed)
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, num_workers=0)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()

    first_loss = last_loss = float("nan")
    steps = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # without it every epoch has the same order
        model.train()
        total = torch.zeros(2, device=device)  # sum of losses, batches
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()  # gradients are averaged across ranks here
            opt.step()
            total += torch.stack([loss.detach(), torch.ones((), device=device)])
            steps += 1
        dist.all_reduce(total)  # the epoch's mean loss over all ranks
        last_loss = (total[0] / total[1]).item()
        if epoch == 0:
            first_loss = last_loss
        if rank == 0:
            print(f"plain_loop: epoch {epoch + 1}/{args.epochs} loss={last_loss:.4f}", flush=True)

    path = Path(args.model_dir) / "model.pt"
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.module.state_dict(), "epochs": args.epochs, "world_size": world_size}, path)
    dist.barrier()  # nobody leaves before the checkpoint exists
    return {"first_loss": first_loss, "loss": last_loss, "steps": steps, "checkpoint": str(path)}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.monotonic()
    rank, world_size, device = setup(args.backend, args.timeout)
    try:
        result = train(args, rank, world_size, device)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print(f"plain_loop: done loss={result['loss']:.4f} first_loss={result['first_loss']:.4f} "
              f"steps={result['steps']} world_size={world_size} checkpoint={result['checkpoint']} "
              f"seconds={time.monotonic() - started:.2f}", flush=True)
    return 0 if math.isfinite(result["loss"]) else 1


if __name__ == "__main__":
    code = main()
    # The process group is destroyed and every file is written: end without interpreter teardown,
    # where torch 2.13's gloo sometimes aborts or hangs after a correct destroy_process_group
    # (docs/facts.md, "The gloo teardown abort").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
