"""The training side of ddp-doctor: `ddp-doctor run`, probes and callbacks."""
