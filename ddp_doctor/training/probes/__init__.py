"""The in-training probes: recorders patched around torch.distributed, DataLoader and DDP, the
fingerprints they take, and how they start in child interpreters and under framework callbacks."""
