"""`ddp-doctor run`: preflight, then the training script in the same processes, watched. Its
command line is read here (run_argv.py); the work is ddp_doctor.training.run.start's.
"""
from __future__ import annotations

import argparse
import os
import sys

HELP = "preflight, then run a training script in the same processes, watched"


def add_parser(p: argparse.ArgumentParser) -> None:
    # Only for --help: main hands everything after `run` over unparsed (see main in ddp_doctor/cli/__init__.py).
    p.add_argument("argv", nargs=argparse.REMAINDER,
                   help="[torchrun options] [--report PATH] [--timeout S] [--hang-timeout S] "
                        "(SCRIPT | -m MODULE) [ARGS...]")


def main(argv: list[str]) -> int:
    """`ddp-doctor run ARGV`; returns the exit status (the script's own after a preflight).
    RunUsageError (a UsageError: exit 2) for a mistake in the command line."""
    from ddp_doctor.cli.run_argv import (
        RunHelpAsked,
        RunUsageError,
        check_nproc_per_node,
        check_torchrun_ranges,
        env_defaults,
        help_text,
        run_options,
        split_argv,
        with_env_defaults,
    )
    from ddp_doctor.facts.launchers import launcher_name, torchrun_pod
    # torchrun's PET_* defaults (Kubeflow's operators configure torchrun with them), as torchrun
    # reads them; under a launcher the ranks inherit them and the launcher has used them already
    here = launcher_name(os.environ) == "none" or torchrun_pod(os.environ)
    defaults = env_defaults(os.environ) if here else []
    try:
        torchrun, doctor, target = split_argv(argv, defaults)
    except RunHelpAsked:
        sys.stdout.write(help_text())
        return 0
    opts = run_options(doctor, target)
    torchrun, origin = with_env_defaults(torchrun, defaults)
    check_nproc_per_node(torchrun, origin)
    check_torchrun_ranges(torchrun, origin)
    if target.path and not os.path.isfile(target.path):
        raise RunUsageError(f"no such script: {target.path}")
    from ddp_doctor.training.run.start import start_run
    return start_run(torchrun, doctor, opts)


def command(args: argparse.Namespace) -> int:
    return main(args.argv)
