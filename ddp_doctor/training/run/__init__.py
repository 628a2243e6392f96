"""`ddp-doctor run`: the parent (torchrun-style options, the elastic agent, the hang watchdog, the
verdict) and each rank (preflight, teardown, the user's script in the same process)."""
