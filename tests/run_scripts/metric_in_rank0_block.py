"""A validation metric reduced inside `if dist.get_rank() == 0:` at the end of each epoch: rank 1
goes on to the next epoch's first backward, whose gradient all_reduce pairs with rank 0's metric;
gloo aborts rank 0 ("Received data size doesn't match ... collective mismatch?"). The cause is
rank 0's all_reduce, in the rank-conditional block."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for _ in range(3):
        loss = model(torch.randn(8, 4)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    if dist.get_rank() == 0:
        accuracy = torch.tensor([0.5])
        dist.all_reduce(accuracy)  # only rank 0 gets here
        print(f"epoch {epoch}: accuracy {accuracy.item() / dist.get_world_size():.3f}")
dist.destroy_process_group()
