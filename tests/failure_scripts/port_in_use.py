"""DDP821: the store cannot listen on a port another process holds."""
import socket
from datetime import timedelta

import torch.distributed as dist

holder = socket.socket()
holder.bind(("127.0.0.1", 0))
holder.listen()
port = holder.getsockname()[1]
dist.TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=5))
