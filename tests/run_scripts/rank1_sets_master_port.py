"""Run with 2 ranks: rank 1 overrides the launcher's MASTER_PORT with a port of its own (the
value left from a notebook), so ranks 0 and 1 wait at different stores inside
init_process_group until torch's timeout (30 minutes)."""
import os

import torch.distributed as dist

if os.environ["RANK"] == "1":
    os.environ["MASTER_PORT"] = os.environ.get("TEST_PORT", "23999")
dist.init_process_group("gloo")
dist.destroy_process_group()
