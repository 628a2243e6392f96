"""The Python API: one line at the top of a training entrypoint.

    import ddp_doctor
    ddp_doctor.preflight()                      # under torchrun, mpirun, SageMaker, SLURM
    ddp_doctor.preflight(rank=r, world_size=n)  # inside a torch.multiprocessing.spawn worker

It runs this rank's preflight, tears its process group and store down so the script's own
init_process_group works unchanged, and on errors writes the report and ends the process with
exit status 3 (SystemExit), before any GPU hour is spent.
"""
from __future__ import annotations

from typing import Any, Iterable


def preflight(*, timeout: float = 60.0, rank: int | None = None, world_size: int | None = None,
              local_rank: int | None = None, report: str | None = None,
              select: Iterable[str] | None = None, skip: Iterable[str] | None = None,
              backend: str | None = None, exit_on_failure: bool = True) -> dict[str, Any]:
    """Run this rank's preflight; returns the report (on the reporting rank the merged one, on the
    others the verdict). The reporting rank prints one line on stderr when all is well (the verdict
    and the report's path), the report text otherwise; the report goes to --report, else
    $DDP_DOCTOR_REPORT, else $SM_OUTPUT_DATA_DIR (SageMaker) or the working directory."""
    from ddp_doctor import checks as catalogue
    from ddp_doctor import registry
    from ddp_doctor.context import current_context
    from ddp_doctor.exit_codes import EXIT_FAILED
    from ddp_doctor.preflight_ranks.one_rank import PreflightOptions, RankPreflight
    from ddp_doctor.processes.collector import garbage_of_block_collected
    from ddp_doctor.report.build import exit_code
    from ddp_doctor.report.publish import Output

    sel, skp = registry.parse_selectors(select), registry.parse_selectors(skip)
    bad = catalogue.unknown_selectors(sel + skp)
    if bad:
        raise ValueError(f"select/skip: {', '.join(bad)} match no check ID, ID prefix or category")
    opts = PreflightOptions(timeout=timeout, select=sel, skip=skp, backend=backend, rank=rank,
                   world_size=world_size, local_rank=local_rank,
                   # the reporting rank says a pass in one line too: where the report went is never a surprise
                   output=Output(report_path=report, only_if_not_pass=True, stderr=True, verdict_if_pass=True))
    from ddp_doctor.checks.launcher_env import SCRIPT_FOLLOWS_OPTION
    # The script goes on to its own init_process_group(): DDP110 checks it will find its variables.
    with garbage_of_block_collected():  # the store and process group go, before the script creates its own
        pf = RankPreflight(current_context(backend=backend, rank=rank, world_size=world_size,
                                           local_rank=local_rank, options={SCRIPT_FOLLOWS_OPTION: True}), opts)
        rep = pf.run()
        del pf
    if exit_on_failure and exit_code(rep) == EXIT_FAILED:
        raise SystemExit(EXIT_FAILED)
    return rep
