"""DDP839: a GPU training script on a host (or torch build) without CUDA."""
import torch

torch.zeros(1).to("cuda")
