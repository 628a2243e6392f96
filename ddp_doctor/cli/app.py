"""The `ddp-doctor` command line. Each subcommand is a parser function plus a command function,
registered in COMMANDS. Nothing here imports torch: ranks import it when they need it.

Exit codes (DESIGN.md): 0 no errors, 3 preflight found errors, 2 usage error, 1 ddp-doctor failed.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from ddp_doctor.version import __version__

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return v


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number no smaller than `minimum`."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be at least {minimum}")
        return v
    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _threshold(text: str) -> tuple[str, float]:
    key, sep, value = text.partition("=")
    try:
        if not sep or not key.strip():
            raise ValueError
        return key.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=NUMBER (e.g. shm_min_mib=512)") from None


# ---------------------------------------------------------------- preflight
def add_preflight(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=_positive_int, default=None, metavar="N",
                   help="with no launcher around ddp-doctor: how many local ranks to start "
                        "(default: one per visible GPU, or 2 gloo ranks on CPU)")
    p.add_argument("--report", metavar="PATH", default=None,
                   help="write the merged JSON report here, pass or fail "
                        "(default: $DDP_DOCTOR_REPORT or ./ddp-doctor-report.json)")
    p.add_argument("--timeout", type=_positive_float, default=60.0, metavar="S",
                   help="bound in seconds for each wait: reaching the master, meeting the other "
                        "ranks, creating the process group, each collective (default: 60)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    p.add_argument("--select", action="append", metavar="X",
                   help="run only these checks: IDs, ID prefixes (DDP2) or categories, comma-separated")
    p.add_argument("--skip", action="append", metavar="X", help="skip these checks (same forms as --select)")
    p.add_argument("--backend", choices=("gloo", "nccl", "smddp", "mpi"), default=None,
                   help="process-group backend to test (default: smddp for SageMaker smdistributed "
                        "jobs, nccl with GPUs, gloo without)")
    p.add_argument("--verbose", "-v", action="store_true", help="show every info finding and hint")
    p.add_argument("--report-s3-uri", metavar="S3_URI", default=None,
                   help="also upload the merged report there, e.g. s3://bucket/prefix/ (needs boto3; "
                        "default: $DDP_DOCTOR_REPORT_S3_URI); a failed upload is only a warning")
    from ddp_doctor.comm.sweep import add_preflight_options  # the communication checks' options
    add_preflight_options(p)
    p.add_argument("--expect-gpus", type=_non_negative_int, default=None, metavar="N",
                   help="the GPUs this host should have: fewer usable ones is an error (DDP590)")
    p.add_argument("--output-dir", metavar="DIR", default=None,
                   help="where the job writes models and checkpoints: its free space is checked (DDP603)")
    p.add_argument("--threshold", action="append", metavar="KEY=VALUE", type=_threshold, default=None,
                   help="override a GPU/host check threshold (repeatable): shm_min_mib (1024), "
                        "ram_min_mib_per_rank (1024), disk_min_free_gib (10), open_files_min (4096), "
                        "gpu_busy_mib (1024), pcie_load_pct (50)")


# Options only the parent of a self-launched preflight uses; every other option is passed on to
# the ranks as given, so options added for checks need no forwarding code.
PARENT_ONLY = {"--nproc-per-node": True, "--nproc_per_node": True, "--report": True, "--report-s3-uri": True, "--json": False,
               "--verbose": False, "-v": False}


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
    from ddp_doctor.comm.sweep import options_from_args  # communication checks (comm_*, instance_type, ...)
    opts.update(options_from_args(args))
    return opts


def cmd_preflight(args: argparse.Namespace) -> int:
    import os

    from ddp_doctor import registry
    from ddp_doctor.facts.launchers import launcher_name
    from ddp_doctor.report.publish import Output

    select, skip = registry.parse_selectors(args.select), registry.parse_selectors(args.skip)
    bad = registry.unknown_selectors(select + skip)
    if bad:
        raise UsageError(f"--select/--skip: {', '.join(bad)} match no check ID, ID prefix or category "
                         f"(see `ddp-doctor list-checks`)")
    check_options(args)  # a bad --threshold is a usage error before any rank starts
    out = Output(report_path=args.report, json=args.json, verbose=args.verbose, report_s3_uri=args.report_s3_uri)
    if launcher_name(os.environ) == "none":
        from ddp_doctor.preflight_run.local_launch import default_nproc, launch_local
        nproc = args.nproc_per_node or default_nproc(dict(os.environ))
        return launch_local(nproc, ["preflight", *rank_argv(args.argv)], timeout=args.timeout, out=out)
    from ddp_doctor.preflight_run.rank import PreflightOptions, run_preflight_rank
    code = run_preflight_rank(PreflightOptions(timeout=args.timeout, select=select, skip=skip, backend=args.backend,
                            output=out, check_options=check_options(args)))
    _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """End a rank process without running interpreter teardown: torch 2.13's gloo can abort in
    static destructors after a correct destroy_process_group (DOMAIN.md section 2), which would
    turn a finished preflight into a SIGABRT. Everything was flushed and written before this."""
    import os
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ---------------------------------------------------------------- catalogue
def add_list_checks(p: argparse.ArgumentParser) -> None:
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the catalogue as JSON")
    fmt.add_argument("--markdown", action="store_true", help="print the catalogue as a Markdown table")


def catalogue_markdown() -> str:
    """The README's check table, generated from the same docstrings `explain` prints."""
    from ddp_doctor import registry
    rows = ["| ID | category | severity | title | what it checks |", "|---|---|---|---|---|"]
    for c in sorted(registry.load_catalogue().values(), key=lambda c: c.id):
        what = c.sections.get("What", "").replace("|", "\\|")
        rows.append(f"| {c.id} | {c.category} | {c.severity} | {c.title} | {what} |")
    for rid, why in sorted(registry.RETIRED.items()):
        rows.append(f"| {rid} | retired | | | {why} |")
    return "\n".join(rows)


def cmd_list_checks(args: argparse.Namespace) -> int:
    from ddp_doctor import registry
    entries = sorted(registry.load_catalogue().values(), key=lambda c: c.id)
    if args.markdown:
        print(catalogue_markdown())
        return EXIT_OK
    if args.json:
        print(json.dumps({"checks": [c.to_dict() for c in entries],
                          "retired": registry.RETIRED}, indent=2))
        return EXIT_OK
    for c in entries:
        print(f"{c.id}  {c.severity:<7}  {c.category:<14} {c.stage:<10} {c.title}")
    for rid, why in sorted(registry.RETIRED.items()):
        print(f"{rid}  retired: {why}")
    return EXIT_OK


def add_explain(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="a check ID, e.g. DDP101")


def cmd_explain(args: argparse.Namespace) -> int:
    from ddp_doctor import registry
    cat = registry.load_catalogue()
    cid = args.id.strip().upper()
    if cid in registry.RETIRED:
        print(f"{cid}: retired. {registry.RETIRED[cid]}")
        return EXIT_OK
    if cid not in cat:
        near = [c for c in sorted(cat) if c.startswith(cid[:4])][:10]
        raise UsageError(f"no check {args.id!r}" + (f"; IDs nearby: {', '.join(near)}" if near else "")
                         + " (see `ddp-doctor list-checks`)")
    c = cat[cid]
    s = c.sections
    print(f"{c.id}: {c.title}\ncategory: {c.category}   severity: {c.severity}   runs: {c.stage}\n")
    for name in ("What", "Why", "Fix"):
        print(f"{name}: {s.get(name, '')}\n")
    return EXIT_OK


# ---------------------------------------------------------------- env
def add_env(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def cmd_env(args: argparse.Namespace) -> int:
    from ddp_doctor.cli.env_command import collect_env, render_env
    data = collect_env()
    print(json.dumps(data, indent=2, default=str) if args.json else render_env(data))
    return EXIT_OK


# ---------------------------------------------------------------- run
def add_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("argv", nargs=argparse.REMAINDER,
                   help="[torchrun options] [--report PATH] [--timeout S] [--hang-timeout S] "
                        "(SCRIPT | -m MODULE) [ARGS...]")


def cmd_run(args: argparse.Namespace) -> int:
    from ddp_doctor.training.run.command import RunUsageError
    from ddp_doctor.training.run.command import main as run_main
    try:
        return run_main(args.argv)
    except RunUsageError as e:
        raise UsageError(str(e)) from None


def _bench_comm() -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]:
    from ddp_doctor.cli.bench_comm import add_bench_comm, cmd_bench_comm
    return add_bench_comm, cmd_bench_comm


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "preflight": ("check the launcher environment, the network and the process group", add_preflight, cmd_preflight),
    "run": ("preflight, then run a training script in the same processes, watched", add_run, cmd_run),
    "env": ("print a paste-ready summary of versions, launcher and environment", add_env, cmd_env),
    "list-checks": ("list the check catalogue", add_list_checks, cmd_list_checks),
    "explain": ("explain one check: what it does, why it matters, how to fix it", add_explain, cmd_explain),
    "sagemaker-check": ("check a SageMaker training job's settings before launch (needs boto3: the aws extra)",
                        lambda p: __import__("ddp_doctor.sagemaker.job", fromlist=["_"]).add_parser(p),
                        lambda a: __import__("ddp_doctor.sagemaker.job", fromlist=["_"]).command(a)),
    "bench-comm": ("run only the all_reduce sweep and print an nccl-tests style table", *_bench_comm()),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddp-doctor",
        description="Diagnose PyTorch DistributedDataParallel jobs: preflight checks of the launcher "
                    "environment, the network and the process group, with a structured report.",
        epilog="Exit codes: 0 no errors, 3 errors found, 2 usage error, 1 ddp-doctor failed.")
    parser.add_argument("--version", action="version", version=f"ddp-doctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, add, func) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add(p)
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "run":
        # `run` takes torchrun's options and then the script's own: argparse must not see them.
        args = argparse.Namespace(command="run", argv=argv[1:], func=cmd_run)
    else:
        args = parser.parse_args(argv)
    if args.command != "run":
        args.argv = argv[argv.index(args.command) + 1:] if args.command in argv else []
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except UsageError as e:
        sys.stderr.write(f"ddp-doctor {args.command}: error: {e}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("ddp-doctor: interrupted\n")
        return 130
