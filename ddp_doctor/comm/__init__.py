"""Collective benchmarks with the nccl-tests methodology: sizes, sweeps, node layout, stragglers,
expected bandwidth, and the table and plot of `ddp-doctor bench-comm`."""
