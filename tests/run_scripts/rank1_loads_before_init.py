"""Rank 1 reads its data files one by one in a for loop before init_process_group (a slow
storage path: each read takes 0.5 s, 60 of them), longer than init's 8 s timeout, so rank 0's
init times out waiting for it. The cause is rank 1, in its loading loop; rank 0's store timeout
is the consequence."""
import datetime
import os
import tempfile
import time

import torch
import torch.distributed as dist

shard = []
if os.environ["RANK"] == "1":
    with tempfile.TemporaryDirectory() as d:
        for i in range(60):
            path = os.path.join(d, f"part-{i}.txt")
            with open(path, "w") as f:
                f.write(str(i))
            with open(path) as f:
                shard.append(int(f.read()))
            time.sleep(0.5)  # the slow read of one file
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=8))
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
