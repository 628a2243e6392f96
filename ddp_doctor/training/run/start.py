"""The three ways `ddp-doctor run` runs, once its command line is read (cli/run_argv.py):

- Under a launcher (torchrun, mpirun, SLURM, SageMaker): act as this rank (watched_rank.py).
- No launcher and no --nproc-per-node / --nnodes: one process, in this process, as `python SCRIPT`
  would run (scripts that start their own ranks with torch.multiprocessing.spawn work).
- Otherwise: the parent of local ranks (parent.py): start them through torch's elastic launcher
  (agent.py), watch their heartbeats for hangs, and merge what they left into one report.
"""
from __future__ import annotations

import os
import sys
from typing import Any


def start_run(torchrun: list[str], doctor: list[str], opts: Any) -> int:
    """Run `opts.target` (RunOptions) with the torchrun and ddp-doctor options as given; returns
    the exit status (the script's own after a preflight)."""
    from ddp_doctor.facts.launchers import launcher_name, torchrun_pod
    from ddp_doctor.training.run.agent import torchrun_value
    # a Kubeflow pod's RANK / WORLD_SIZE meant for torchrun are the pod's: this process launches
    under_launcher = launcher_name(os.environ) != "none" and not torchrun_pod(os.environ)
    if under_launcher or not (
            torchrun_value(torchrun, "--nproc-per-node", "--nproc_per_node") or torchrun_value(torchrun, "--nnodes")):
        if torchrun and under_launcher:
            sys.stderr.write("ddp-doctor run: warning: launcher options ignored under a launcher\n")
        from ddp_doctor.training.run.watched_rank import run_training_rank
        return run_training_rank(opts)
    from ddp_doctor.training.run.parent import launch
    return launch(torchrun, doctor, opts.target, opts)
