"""torch's elastic launcher for a self-launched preflight (local_launch.launcher_command): torchrun's
own argument parser and launch code, without torchrun's traceback when its own rendezvous fails.

    python -m ddp_doctor.preflight_ranks.launcher [torchrun options] -m ddp_doctor preflight ...

A pod's launcher waits for the other pods in torch's rendezvous (bounded by the --rdzv-conf that
local_launch passes). When they never come, or the rendezvous fails otherwise, no rank starts:
the finding (launcher_rendezvous.rendezvous_finding, worded in checks/rendezvous.py as `run`'s
launcher words it) is left in the launch directory as the final record of this node's ranks, and
the launcher exits 3, as a failed preflight does.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

from ddp_doctor.exit_codes import EXIT_FAILED
from ddp_doctor.processes.launch_dir import LAUNCH_DIR_ENV, rank_path

FIRST_RANK_ENV = "DDP_DOCTOR_FIRST_RANK"  # the first global rank this launcher starts (local_launch)


def main(argv: list[str] | None = None) -> int:
    from ddp_doctor.processes.collector import imports_uncollected
    with imports_uncollected():  # the ranks start sooner
        from torch.distributed import DistError
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.elastic.rendezvous import RendezvousError
        from torch.distributed.run import parse_args, run
    quiet_launcher_logs()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except (DistError, RendezvousError) as e:  # before any rank started: the nodes did not meet
        launch_dir = os.environ.get(LAUNCH_DIR_ENV)
        if not launch_dir:
            raise
        from ddp_doctor.preflight_ranks.launcher_rendezvous import nodes_of, rendezvous_finding
        first = int(os.environ.get(FIRST_RANK_ENV) or 0)
        write_unstarted(launch_dir, range(first, first + nodes_of(args)[2]), rendezvous_finding(args, e).to_dict())
        return EXIT_FAILED
    except SignalException as e:  # stopped (ddp-doctor's parent ends it at its bound, or a stop): it reports why
        return 128 + int(e.sigval)
    except ChildFailedError as e:  # a rank's own report says why: no banner of torchrun's over it
        return first_failure_status(e)
    return 0


def first_failure_status(e: Any) -> int:
    """The exit status of the first rank that failed (torch's ChildFailedError), as the shell shows
    it: a signal -N as 128 + N."""
    _, first = e.get_first_failure()
    code = int(first.exitcode)
    return code if code > 0 else 128 - code


def quiet_launcher_logs() -> None:
    """torch's launcher logs each failure, with a banner, over the report that says it better."""
    quiet = ("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher")
    for name in [*quiet, *logging.root.manager.loggerDict]:
        if name.startswith(quiet):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def write_unstarted(launch_dir: str, ranks: range, finding: dict[str, Any]) -> None:
    """Each rank of this launcher ends here, having started nowhere: the first carries the finding
    (redacted, as every rank's record: it quotes torch's error)."""
    from ddp_doctor.report.private_files import write_private
    from ddp_doctor.report.redact import redact_obj
    for i, r in enumerate(ranks):
        try:
            write_private(rank_path(launch_dir, r), json.dumps(redact_obj(
                {"rank": r, "final": True, "view": {}, "findings": [finding] if i == 0 else []})))
        except (OSError, ValueError):
            pass


if __name__ == "__main__":
    sys.exit(main())
