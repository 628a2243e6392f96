"""Helpers shared by the tests: contexts, fake NVML, simulated nodes, process handling."""
