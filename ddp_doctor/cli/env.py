"""`ddp-doctor env`: print a paste-ready summary of versions, launcher and environment (the
summary itself is ddp_doctor.cli.env_summary, imported only when the command runs).
"""
from __future__ import annotations

import argparse
import json

from ddp_doctor.exit_codes import EXIT_OK

HELP = "print a paste-ready summary of versions, launcher and environment"


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def command(args: argparse.Namespace) -> int:
    from ddp_doctor.cli.env_summary import collect_env, render_env
    data = collect_env()
    print(json.dumps(data, indent=2, default=str) if args.json else render_env(data))
    return EXIT_OK
