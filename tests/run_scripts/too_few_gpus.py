"""The shape of pytorch/examples' distributed/ddp/example.py run with no arguments on a host without
enough GPUs: each launched rank checks torch.cuda.device_count() against the GPUs it needs, prints
"Unable to locate sufficient 2 gpus" and returns before init_process_group, with exit status 0."""
import os

import torch


def main(needed: int = 2) -> None:
    if torch.cuda.device_count() < needed:
        print(f"Unable to locate sufficient {needed} gpus to run this example. Exiting.")
        return
    raise SystemExit("not reached on a host without GPUs")


if __name__ == "__main__":
    main(int(os.environ.get("WORLD_SIZE", "2")))
