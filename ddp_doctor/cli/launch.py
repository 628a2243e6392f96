"""What the subcommands that act as ranks (preflight, bench-comm) share: the arguments a
self-launched rank gets (rank_argv), their --nproc-per-node (add_nproc_option) and the way a rank
process ends (exit_now).
"""
from __future__ import annotations

import argparse
import os
import sys

# Options only the parent of a self-launched preflight uses (True: they take a value); every
# other option is passed on to the ranks as given, so options added for checks need no forwarding code.
PARENT_ONLY = {"--nproc-per-node": True, "--nproc_per_node": True, "--report": True, "--report-s3-uri": True,
               "--trace": True, "--fail-on": True,
               "--json": False, "--verbose": False, "-v": False, "--progress": False, "--no-progress": False,
               "--quiet": False, "-q": False}


def add_nproc_option(p: argparse.ArgumentParser) -> None:
    """--nproc-per-node, as the subcommands that launch their own ranks take it."""
    from ddp_doctor.cli.options import positive_int
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=positive_int, default=None, metavar="N",
                   help="with no launcher around ddp-doctor: how many local ranks to start "
                        "(default: one per visible GPU, or 2 gloo ranks on CPU)")


def add_history_options(p: argparse.ArgumentParser, what: str) -> None:
    """--history PATH / --no-history, for a command whose ranks record `what` (history/database.choose
    acts on them)."""
    p.add_argument("--history", default=None, metavar="PATH",
                   help=f"append {what} to the history there (default: $DDP_DOCTOR_HISTORY, "
                        "else ~/.cache/ddp-doctor/history.sqlite)")
    p.add_argument("--no-history", action="store_true", help="record nothing in the history")


def rank_argv(argv: list[str]) -> list[str]:
    """The preflight arguments a self-launched rank gets: `argv` less the parent-only options."""
    out: list[str] = []
    skip_value = False
    for a in argv:
        if skip_value:
            skip_value = False
            continue
        name = a.split("=", 1)[0]
        if name in PARENT_ONLY:
            skip_value = PARENT_ONLY[name] and "=" not in a
            continue
        out.append(a)
    return out


def exit_now(code: int) -> None:
    """End a rank process without running interpreter teardown: torch 2.13's gloo can abort in
    static destructors after a correct destroy_process_group (docs/facts.md, "The gloo teardown abort"), which would
    turn a finished preflight into a SIGABRT. Everything was flushed and written before this."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
