"""Run as `ddp-doctor run spawn_rank_out_of_range.py`: spawned processes numbered from 1 instead
of 0 (rank=i + 1 in a world of 2): rank 0 never comes, and without ddp-doctor both wait inside
init_process_group until torch's timeout."""
import os

import torch.distributed as dist
import torch.multiprocessing as mp


def main(i, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=i + 1, world_size=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(os.environ.get("TEST_PORT", "29763"),), nprocs=2)
