"""Predictions gathered across ranks with `all_gather`, each rank's tensor as long as its own data
(3 on rank 0, 4 on rank 1): gloo aborts a rank whose received size does not match ("Received
data size doesn't match ... collective mismatch?"), or a rank raises. Either way the verdict is the
mismatch at that line with both ranks' sizes."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
predictions = torch.arange(3 + dist.get_rank(), dtype=torch.float32)
gathered = [torch.empty_like(predictions) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, predictions)
print(sum(g.sum().item() for g in gathered))
dist.destroy_process_group()
