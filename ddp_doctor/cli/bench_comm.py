"""`ddp-doctor bench-comm`: only the all_reduce sweep (check DDP401, with the bandwidth verdict
DDP403), in full: every size gets warm-up and timed iterations, no time budget. Rank 0 prints an
nccl-tests style table as the sizes complete; `--plot PATH.png` draws bandwidth against size.

Like `preflight`, it acts as a rank under a launcher and starts local ranks itself without one
(the same rendezvous, bounds and report). Also here: the communication checks' preflight options
(add_comm_options) and the check settings both commands' options give (comm_options).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

from ddp_doctor.cli.launch import add_history_options, add_nproc_option, exit_now, rank_argv
from ddp_doctor.cli.options import UsageError, byte_size, positive_int, timeout_seconds
from ddp_doctor.comm import expected, stragglers, sweep, table
from ddp_doctor.comm.arithmetic import format_bytes
from ddp_doctor.exit_codes import EXIT_INTERNAL

HELP = "run only the all_reduce sweep and print an nccl-tests style table"


def selected_checks() -> list[str]:
    """The IDs bench-comm runs: the all_reduce sweep and its bandwidth verdict."""
    from ddp_doctor import checks
    from ddp_doctor.checks.communication import all_reduce_correct, bandwidth_expected
    return sorted(c.id for c in checks.load_catalogue().values() if c.func in (all_reduce_correct, bandwidth_expected))


def add_parser(p: argparse.ArgumentParser) -> None:
    add_nproc_option(p)
    p.add_argument("--min-bytes", type=byte_size, default=None, metavar="SIZE",
                   help=f"smallest size (default: {format_bytes(sweep.DEFAULT_MIN_BYTES)})")
    p.add_argument("--max-bytes", type=byte_size, default=None, metavar="SIZE",
                   help=f"largest size (default: {format_bytes(sweep.DEFAULT_MAX_BYTES_GPU)} on GPU, "
                        f"{format_bytes(sweep.DEFAULT_MAX_BYTES_CPU)} on CPU); sizes double in between")
    p.add_argument("--iters", type=positive_int, default=None, metavar="N",
                   help=f"timed iterations per size (default: {sweep.BENCH_ITERS})")
    p.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                   help=f"warm-up iterations per size, the first one checked (default: {sweep.BENCH_WARMUP})")
    p.add_argument("--plot", metavar="PATH.png", default=None,
                   help="write a bandwidth-vs-size plot (PNG, log-scale x and y); needs matplotlib "
                        "(pip install 'ddp-doctor[plot]')")
    p.add_argument("--report", metavar="PATH", default=None,
                   help="write the JSON report (measurements.all_reduce) here "
                        "(default: $DDP_DOCTOR_REPORT or ./ddp-doctor-report.json)")
    p.add_argument("--timeout", type=timeout_seconds, default=60.0, metavar="S",
                   help="bound in seconds for each wait, each collective included (default: 60)")
    p.add_argument("--backend", choices=("gloo", "nccl", "smddp", "mpi"), default=None,
                   help="process-group backend (default: nccl with GPUs, gloo without)")
    p.add_argument("--instance-type", default=None, metavar="TYPE",
                   help="judge busbw against this instance type's expected figure (e.g. ml.p4d.24xlarge)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    add_history_options(p, "the sweep's figures")
    p.add_argument("--verbose", "-v", action="store_true", help="show every info finding and hint")


def add_comm_options(p: argparse.ArgumentParser) -> None:
    """The communication suite's preflight options (they reach the checks as ctx.options)."""
    g = p.add_argument_group("communication checks")
    g.add_argument("--comm-min-bytes", type=byte_size, default=None, metavar="SIZE",
                   help=f"smallest all_reduce size of the sweep (default: {format_bytes(sweep.DEFAULT_MIN_BYTES)})")
    g.add_argument("--comm-max-bytes", type=byte_size, default=None, metavar="SIZE",
                   help=f"largest all_reduce size (default: {format_bytes(sweep.DEFAULT_MAX_BYTES_GPU)} on GPU, "
                        f"{format_bytes(sweep.PREFLIGHT_MAX_BYTES_CPU)} on CPU)")
    g.add_argument("--comm-iters", type=positive_int, default=None, metavar="N",
                   help=f"at most N timed iterations per size (default: {sweep.PREFLIGHT_ITERS} in a preflight, "
                        f"{sweep.BENCH_ITERS} in bench-comm)")
    g.add_argument("--comm-budget", type=float, default=None, metavar="S",
                   help=f"seconds the timed loops of one preflight sweep may take together; fewer "
                        f"iterations at large sizes keep within it; 0 for none (default: "
                        f"{sweep.PREFLIGHT_BUDGET_S_CPU:g} on CPU, {sweep.PREFLIGHT_BUDGET_S_GPU:g} on GPU)")
    g.add_argument("--comm-min-fraction", type=float, default=None, metavar="F",
                   help=f"warn when busbw at the largest size is below F x what the instance type "
                        f"reaches (default: {expected.DEFAULT_MIN_FRACTION})")
    g.add_argument("--instance-type", default=None, metavar="TYPE",
                   help="instance type for the expected bandwidth, e.g. ml.p4d.24xlarge "
                        "(default: SageMaker's SM_CURRENT_INSTANCE_TYPE / resourceconfig.json)")
    g.add_argument("--straggler-factor", type=float, default=None, metavar="X",
                   help=f"a rank or link slower than X x the median is named "
                        f"(default: {stragglers.DEFAULT_STRAGGLER_FACTOR})")
    g.add_argument("--straggler-min-ms", type=float, default=None, metavar="MS",
                   help=f"... and only when it is more than MS ms slower "
                        f"(default: {stragglers.DEFAULT_STRAGGLER_MIN_S * 1e3:g})")
    g.add_argument("--max-clock-skew", type=float, default=None, metavar="S",
                   help=f"warn when node clocks differ by more than S seconds "
                        f"(default: {stragglers.DEFAULT_MAX_CLOCK_SKEW_S:g})")


def comm_options(args: argparse.Namespace) -> dict[str, Any]:
    """ctx.options keys of the communication suite, from parsed preflight or bench-comm options
    (absent or unset options are left out, so each check falls back to its default)."""
    pairs = {
        "comm_min_bytes": getattr(args, "comm_min_bytes", None) or getattr(args, "min_bytes", None),
        "comm_max_bytes": getattr(args, "comm_max_bytes", None) or getattr(args, "max_bytes", None),
        "comm_iters": getattr(args, "comm_iters", None) or getattr(args, "iters", None),
        "comm_warmup": getattr(args, "warmup", None),
        "comm_budget_s": getattr(args, "comm_budget", None),
        "comm_min_fraction": getattr(args, "comm_min_fraction", None),
        "instance_type": getattr(args, "instance_type", None),
        "straggler_factor": getattr(args, "straggler_factor", None),
        "straggler_min_s": (None if getattr(args, "straggler_min_ms", None) is None
                            else args.straggler_min_ms / 1e3),
        "max_clock_skew_s": getattr(args, "max_clock_skew", None),
    }
    return {k: v for k, v in pairs.items() if v is not None}


def progress_printer(stream: Any = None) -> Callable[[dict[str, Any]], None]:
    """Prints the table header once per group, then one row per size as it completes."""
    state = {"group": None}

    def show(entry: dict[str, Any]) -> None:
        out = stream or sys.stdout
        if entry.get("group") != state["group"]:
            state["group"] = entry.get("group")
            out.write(f"# all_reduce, {entry.get('group', 'world')} group of {entry.get('nranks')} ranks\n"
                      f"{table.TABLE_HEADER}\n")
        out.write(table.table_row(entry) + "\n")
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
        table.plot(rep.get("measurements") or {}, plot_path, title=title)
    except (OSError, ValueError, RuntimeError) as e:
        return f"--plot {plot_path}: {e}"
    return None


def command(args: argparse.Namespace) -> int:
    from ddp_doctor.facts.launchers import launcher_name
    from ddp_doctor.report.publish import Output, warn

    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install 'ddp-doctor[plot]' "
                             "(or pip install matplotlib)") from None
    out = Output(report_path=args.report, json=args.json, verbose=args.verbose, command="bench-comm")
    from ddp_doctor.history.database import choose
    choose(args.history, args.no_history)  # the ranks inherit it
    if launcher_name(os.environ) == "none":
        from ddp_doctor.preflight_ranks.local_launch import default_nproc, launch_local
        nproc = args.nproc_per_node or default_nproc(dict(os.environ))
        code = launch_local(nproc, ["bench-comm", *rank_argv(args.argv)], timeout=args.timeout, out=out,
                            progress=False)  # its table is its progress: no stage lines beside it
        if args.plot:
            err = write_plot(out.path(), args.plot)
            if err:
                warn(err)
                return code or EXIT_INTERNAL
            if not args.json:
                print(f"Plot: {args.plot}")
        return code
    from ddp_doctor.preflight_ranks.one_rank import PreflightOptions, run_preflight_rank
    from ddp_doctor.processes.launch_dir import LAUNCH_DIR_ENV
    options: dict[str, Any] = {**comm_options(args), "comm_mode": "bench"}
    if not args.json:
        options["comm_progress"] = progress_printer()
    code = run_preflight_rank(PreflightOptions(timeout=args.timeout, select=selected_checks(), backend=args.backend,
                            output=out, check_options=options))
    self_launched = bool(os.environ.get(LAUNCH_DIR_ENV))
    from ddp_doctor.facts.launchers import detect
    if args.plot and not self_launched and (detect(os.environ).rank or 0) == 0:
        err = write_plot(out.path(), args.plot)
        if err:
            warn(err)
        elif not args.json:
            print(f"Plot: {args.plot}")
    exit_now(code)
    return code
