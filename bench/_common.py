"""What the benchmark scripts share: the environment a launch starts from."""
from __future__ import annotations

import os

LAUNCHER_PREFIXES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC_", "OMPI_", "SM_",
                     "DDP_DOCTOR_")


def clean_env() -> dict[str, str]:
    """This environment without any launcher's variables, one OpenMP thread per rank (torchrun's
    default), so every measured launch starts from the same place."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env["OMP_NUM_THREADS"] = "1"
    return env
