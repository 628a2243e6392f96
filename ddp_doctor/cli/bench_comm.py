"""`ddp-doctor bench-comm`: only the all_reduce sweep (check DDP401, with the bandwidth verdict
DDP403), in full: every size gets warm-up and timed iterations, no time budget. Rank 0 prints an
nccl-tests style table as the sizes complete; `--plot PATH.png` draws bandwidth against size.

Like `preflight`, it acts as a rank under a launcher and starts local ranks itself without one
(the same rendezvous, bounds and report).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

from ddp_doctor.comm import sweep as comm

SELECT = ["DDP401", "DDP403"]


def add_bench_comm(p: argparse.ArgumentParser) -> None:
    from ddp_doctor.cli.app import _positive_float, _positive_int
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=_positive_int, default=None, metavar="N",
                   help="with no launcher around ddp-doctor: how many local ranks to start "
                        "(default: one per visible GPU, or 2 gloo ranks on CPU)")
    p.add_argument("--min-bytes", type=comm.parse_bytes, default=None, metavar="SIZE",
                   help=f"smallest size (default: {comm.format_bytes(comm.DEFAULT_MIN_BYTES)})")
    p.add_argument("--max-bytes", type=comm.parse_bytes, default=None, metavar="SIZE",
                   help=f"largest size (default: {comm.format_bytes(comm.DEFAULT_MAX_BYTES_GPU)} on GPU, "
                        f"{comm.format_bytes(comm.DEFAULT_MAX_BYTES_CPU)} on CPU); sizes double in between")
    p.add_argument("--iters", type=_positive_int, default=None, metavar="N",
                   help=f"timed iterations per size (default: {comm.BENCH_ITERS})")
    p.add_argument("--warmup", type=_positive_int, default=None, metavar="N",
                   help=f"warm-up iterations per size, the first one checked (default: {comm.BENCH_WARMUP})")
    p.add_argument("--plot", metavar="PATH.png", default=None,
                   help="write a bandwidth-vs-size plot (PNG, log-scale x); needs matplotlib "
                        "(pip install 'ddp-doctor[plot]')")
    p.add_argument("--report", metavar="PATH", default=None,
                   help="write the JSON report (measurements.all_reduce) here "
                        "(default: $DDP_DOCTOR_REPORT or ./ddp-doctor-report.json)")
    p.add_argument("--timeout", type=_positive_float, default=60.0, metavar="S",
                   help="bound in seconds for each wait, each collective included (default: 60)")
    p.add_argument("--backend", choices=("gloo", "nccl", "smddp", "mpi"), default=None,
                   help="process-group backend (default: nccl with GPUs, gloo without)")
    p.add_argument("--instance-type", default=None, metavar="TYPE",
                   help="judge busbw against this instance type's expected figure (e.g. ml.p4d.24xlarge)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    p.add_argument("--verbose", "-v", action="store_true", help="show every info finding and hint")


def progress_printer(stream: Any = None) -> Callable[[dict[str, Any]], None]:
    """Prints the table header once per group, then one row per size as it completes."""
    state = {"group": None}

    def show(entry: dict[str, Any]) -> None:
        out = stream or sys.stdout
        if entry.get("group") != state["group"]:
            state["group"] = entry.get("group")
            out.write(f"# all_reduce, {entry.get('group', 'world')} group of {entry.get('nranks')} ranks\n"
                      f"{comm.TABLE_HEADER}\n")
        out.write(comm.table_row(entry) + "\n")
        out.flush()
    return show


def write_plot(report_path: str, plot_path: str) -> str | None:
    """Plot the report's sweeps; an error message, or None when the PNG was written."""
    import json
    try:
        with open(report_path, encoding="utf-8") as f:
            rep = json.load(f)
        world = rep.get("world") or {}
        title = (f"ddp-doctor bench-comm: {world.get('world_size')} ranks, backend {world.get('backend')}")
        comm.plot(rep.get("measurements") or {}, plot_path, title=title)
    except (OSError, ValueError, RuntimeError) as e:
        return f"--plot {plot_path}: {e}"
    return None


def cmd_bench_comm(args: argparse.Namespace) -> int:
    from ddp_doctor.cli.app import UsageError, _exit_now, rank_argv
    from ddp_doctor.facts.launchers import launcher_name
    from ddp_doctor.report.publish import Output, warn

    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install 'ddp-doctor[plot]' "
                             "(or pip install matplotlib)") from None
    out = Output(report_path=args.report, json=args.json, verbose=args.verbose)
    if launcher_name(os.environ) == "none":
        from ddp_doctor.preflight_run.local_launch import default_nproc, launch_local
        nproc = args.nproc_per_node or default_nproc(dict(os.environ))
        code = launch_local(nproc, ["bench-comm", *rank_argv(args.argv)], timeout=args.timeout, out=out)
        if args.plot:
            err = write_plot(out.path(), args.plot)
            if err:
                warn(err)
                return code or 1
            if not args.json:
                print(f"Plot: {args.plot}")
        return code
    from ddp_doctor.preflight_run.rank import LAUNCH_DIR_ENV, PreflightOptions, run_preflight_rank
    options: dict[str, Any] = {**comm.options_from_args(args), "comm_mode": "bench"}
    if not args.json:
        options["comm_progress"] = progress_printer()
    code = run_preflight_rank(PreflightOptions(timeout=args.timeout, select=list(SELECT), backend=args.backend,
                            output=out, check_options=options))
    self_launched = bool(os.environ.get(LAUNCH_DIR_ENV))
    from ddp_doctor.facts.launchers import detect
    if args.plot and not self_launched and (detect(os.environ).rank or 0) == 0:
        err = write_plot(out.path(), args.plot)
        if err:
            warn(err)
        elif not args.json:
            print(f"Plot: {args.plot}")
    _exit_now(code)
    return code
