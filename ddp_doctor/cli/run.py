"""`ddp-doctor run`: preflight, then the training script in the same processes, watched. The
work is ddp_doctor.training.run.command; here only its usage errors become the CLI's.
"""
from __future__ import annotations

import argparse

from ddp_doctor.cli.options import UsageError

HELP = "preflight, then run a training script in the same processes, watched"


def add_parser(p: argparse.ArgumentParser) -> None:
    # Only for --help: main hands everything after `run` over unparsed (see main in ddp_doctor/cli/__init__.py).
    p.add_argument("argv", nargs=argparse.REMAINDER,
                   help="[torchrun options] [--report PATH] [--timeout S] [--hang-timeout S] "
                        "(SCRIPT | -m MODULE) [ARGS...]")


def command(args: argparse.Namespace) -> int:
    from ddp_doctor.training.run.command import RunUsageError
    from ddp_doctor.training.run.command import main as run_main
    try:
        return run_main(args.argv)
    except RunUsageError as e:
        raise UsageError(str(e)) from None
