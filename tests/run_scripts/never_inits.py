"""Started with 2 ranks (`ddp-doctor run --nproc-per-node 2`), but never calls
init_process_group: each rank trains its own model on its own data and ends well."""
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
