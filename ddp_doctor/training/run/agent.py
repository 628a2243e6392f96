"""torch's elastic launcher, run the way `ddp-doctor run` needs it: torchrun's own argument
parser and launch code (`torch.distributed.run.parse_args` / `run`), without torchrun's uncaught
ChildFailedError traceback and failure banner, and with the root-cause rank's own exit code.

    python -m ddp_doctor.training.run.agent [torchrun options] -m ddp_doctor run ... SCRIPT [ARGS]

ddp-doctor's parent process owns the diagnosis, so the launcher stays quiet about failures.
"""
from __future__ import annotations

import json
import logging
import os
import sys

RESULT_ENV = "DDP_DOCTOR_AGENT_RESULT"


def _write_result(exits: dict[str, int]) -> None:
    """rank -> exit status of the ranks that failed, for the ddp-doctor parent."""
    path = os.environ.get(RESULT_ENV)
    if path:
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(exits, f)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    quiet = ("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher")
    for name in [*quiet, *logging.root.manager.loggerDict]:
        if name.startswith(quiet):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
    except SignalException as e:  # ddp-doctor's parent ended the job (a hang): it reports why
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        _write_result({str(rank): f.exitcode for rank, f in e.failures.items()})
        _, first = e.get_first_failure()
        code = first.exitcode
        return code if code > 0 else 128 - code  # a signal -N as the shell shows it: 128 + N
    return 0


if __name__ == "__main__":
    sys.exit(main())
