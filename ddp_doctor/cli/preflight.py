"""`ddp-doctor preflight`: its options (add_parser), the check settings they give
(check_options) and the command, which acts as a rank under a launcher and starts local ranks
itself without one.
"""
from __future__ import annotations

import argparse
from typing import Mapping

from ddp_doctor.cli.launch import add_history_options, add_nproc_option, exit_now, rank_argv
from ddp_doctor.cli.options import UsageError, non_negative_int, threshold, timeout_seconds
from ddp_doctor.exit_codes import EXIT_BY_ACTION_HELP, FAIL_ON_ENV, FAIL_ON_LEVELS, FailOn, fail_on_setting

HELP = "check the launcher environment, the network and the process group"
FAIL_ON_HELP = (f"exit 3 when the report holds a finding of this severity or worse: errors already do, "
                f"warning makes warnings do too (default: ${FAIL_ON_ENV}, else error)")


def add_parser(p: argparse.ArgumentParser) -> None:
    add_nproc_option(p)
    p.add_argument("--report", metavar="PATH", default=None,
                   help="write the merged JSON report here, pass or fail "
                        "(default: $DDP_DOCTOR_REPORT or ./ddp-doctor-report.json)")
    p.add_argument("--timeout", type=timeout_seconds, default=60.0, metavar="S",
                   help="bound in seconds for each wait: reaching the master, meeting the other "
                        "ranks, creating the process group, each collective (default: 60; at most "
                        "86400, one day)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    add_history_options(p, "this preflight's figures")
    p.add_argument("--fail-on", choices=FAIL_ON_LEVELS, default=None, help=FAIL_ON_HELP)
    p.add_argument("--exit-by-action", action="store_true", help=EXIT_BY_ACTION_HELP)
    p.add_argument("--trace", metavar="PATH", default=None,
                   help="also write the ranks' timelines (rendezvous, each check, the communication sweep, "
                        "teardown) as a Chrome trace there; open it in ui.perfetto.dev or chrome://tracing")
    p.add_argument("--select", action="append", metavar="X",
                   help="run only these checks: IDs, ID prefixes (DDP2) or categories, comma-separated")
    p.add_argument("--skip", action="append", metavar="X", help="skip these checks (same forms as --select)")
    p.add_argument("--backend", choices=("gloo", "nccl", "smddp", "mpi"), default=None,
                   help="process-group backend to test (default: smddp for SageMaker smdistributed "
                        "jobs, nccl with GPUs, gloo without)")
    p.add_argument("--verbose", "-v", action="store_true", help="show every info finding and hint")
    p.add_argument("--progress", dest="progress", action="store_const", const=True, default=None,
                   help="with no launcher: say on stderr which stage the ranks are in when the preflight "
                        "takes long (default: $DDP_DOCTOR_PROGRESS, else only when stdout is a terminal)")
    p.add_argument("--no-progress", "--quiet", "-q", dest="progress", action="store_const", const=False,
                   help="no progress lines")
    p.add_argument("--report-s3-uri", metavar="S3_URI", default=None,
                   help="also upload the merged report there, e.g. s3://bucket/prefix/ (needs boto3; "
                        "default: $DDP_DOCTOR_REPORT_S3_URI); a failed upload is only a warning")
    from ddp_doctor.cli.bench_comm import add_comm_options  # the communication checks' options
    add_comm_options(p)
    p.add_argument("--expect-gpus", type=non_negative_int, default=None, metavar="N",
                   help="the GPUs this host should have: fewer usable ones is an error (DDP590)")
    p.add_argument("--output-dir", metavar="DIR", default=None,
                   help="where the job writes models and checkpoints: its free space is checked (DDP603)")
    p.add_argument("--threshold", action="append", metavar="KEY=VALUE", type=threshold, default=None,
                   help="override a GPU/host check threshold (repeatable): shm_min_mib (1024), "
                        "ram_min_mib_per_rank (1024), disk_min_free_gib (10), open_files_min (4096), "
                        "gpu_busy_mib (1024), pcie_load_pct (50)")


def check_options(args: argparse.Namespace) -> dict[str, object]:
    """Settings for checks (RankContext.options) from the preflight options."""
    opts: dict[str, object] = {}
    if getattr(args, "output_dir", None):
        import os
        opts["output_dir"] = os.path.abspath(args.output_dir)
    if getattr(args, "threshold", None):
        from ddp_doctor.checks import gpu, host
        known = {**gpu.OPTION_DEFAULTS, **host.OPTION_DEFAULTS}
        for key, value in args.threshold:
            if key not in known:
                raise UsageError(f"--threshold {key}: unknown key; known: {', '.join(sorted(known))}")
            opts[key] = value
    if getattr(args, "expect_gpus", None) is not None:
        opts["expect_gpus"] = args.expect_gpus  # checks/runner_expectations.py (DDP590)
    from ddp_doctor.cli.bench_comm import comm_options  # communication checks (comm_*, instance_type, ...)
    opts.update(comm_options(args))
    return opts


def fail_on_option(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> FailOn | None:
    """--fail-on, else DDP_DOCTOR_FAIL_ON (exit_codes.fail_on_setting); a bad value of the variable is a
    usage error naming it."""
    import os
    try:
        return fail_on_setting(getattr(args, "fail_on", None), os.environ if env is None else env)
    except ValueError as e:
        raise UsageError(str(e)) from None


def command(args: argparse.Namespace) -> int:
    import os

    from ddp_doctor import checks as catalogue
    from ddp_doctor import registry
    from ddp_doctor.facts.launchers import launcher_name, torchrun_pod
    from ddp_doctor.report.publish import Output

    select, skip = registry.parse_selectors(args.select), registry.parse_selectors(args.skip)
    bad = catalogue.unknown_selectors(select + skip)
    if bad:
        raise UsageError(f"--select/--skip: {', '.join(bad)} match no check ID, ID prefix or category "
                         f"(see `ddp-doctor list-checks`)")
    check_options(args)  # a bad --threshold is a usage error before any rank starts
    fail_on = fail_on_option(args)
    if getattr(args, "exit_by_action", False):  # in the environment: the ranks read it there
        from ddp_doctor.exit_codes import EXIT_BY_ACTION_ENV
        os.environ[EXIT_BY_ACTION_ENV] = "1"
    from ddp_doctor.history.database import choose
    choose(args.history, args.no_history)
    out = Output(report_path=args.report, json=args.json, verbose=args.verbose, report_s3_uri=args.report_s3_uri)
    if launcher_name(os.environ) == "none" or torchrun_pod(os.environ):
        from ddp_doctor.preflight_ranks.local_launch import default_nproc, launch_local, pod_layout
        # in a pod a Kubeflow operator configured for torchrun: the launcher takes the job's layout
        # from PET_*, as the pod's torchrun would, and the preflight spans every pod
        layout = (pod_layout(os.environ, args.nproc_per_node, args.timeout) if torchrun_pod(os.environ)
                  else args.nproc_per_node or default_nproc(dict(os.environ)))
        return launch_local(layout, ["preflight", *rank_argv(args.argv)], timeout=args.timeout, out=out,
                            trace_path=args.trace, fail_on=fail_on, progress=getattr(args, "progress", None))
    from ddp_doctor.processes.stop_signals import release_early
    release_early()  # a rank under a launcher: the stop signals act as usual (cli holds them from the start)
    from ddp_doctor.preflight_ranks.one_rank import PreflightOptions, run_preflight_rank
    code = run_preflight_rank(PreflightOptions(timeout=args.timeout, select=select, skip=skip, backend=args.backend,
                            output=out, check_options=check_options(args), trace_path=args.trace,
                            fail_on=fail_on))
    exit_now(code)
    return code
