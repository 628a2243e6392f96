"""Rank 1 raises with secrets in its message (a password, a Hugging Face token); rank 0 then fails
in its next collective (a consequence). Planted values, never real."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise RuntimeError("login failed for password=hunter2 token hf_abcdefghijklmnopqrstuvwxyz0123456")
t = torch.ones(4)
dist.all_reduce(t)
dist.all_reduce(t)
