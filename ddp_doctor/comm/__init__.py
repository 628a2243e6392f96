"""Collective benchmarks with the nccl-tests methodology, measured for the `communication` checks
and `ddp-doctor bench-comm`. Modules: arithmetic (sizes, bandwidth formulas, exact sums, fill
patterns), sweep (SweepConfig, bounded Comm, the all_reduce sweep, checked broadcast/all_gather),
layout (nodes and their subgroups), stragglers (slow ranks and nodes, clock skew), expected (the
busbw an instance type should reach, from ddp_doctor.facts.instances), table (the nccl-tests
table and plot). Nothing here imports the command line; its options are ddp_doctor.cli.bench_comm.
"""
