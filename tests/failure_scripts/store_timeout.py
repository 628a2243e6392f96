"""DDP835: a world of 2 but only this process joins: the store times out waiting for clients."""
from datetime import timedelta

import torch.distributed as dist

dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timedelta(seconds=2), wait_for_workers=True)
