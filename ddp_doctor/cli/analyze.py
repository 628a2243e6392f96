"""`ddp-doctor analyze PATH...`: the post-mortem of a job that ran without ddp-doctor, from the
artifacts it left (logs, torchrun's log tree, error files, flight-recorder dumps): the report of
`ddp-doctor run`, made afterwards. Exit status: 0 no error found, 3 errors found, 2 usage error."""
from __future__ import annotations

import argparse
import os

from ddp_doctor.cli.options import UsageError

HELP = "diagnose a job that already ended from the artifacts it left (logs, torchrun --log-dir, error files, dumps)"


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", metavar="PATH", nargs="+",
                   help="files or directories (walked) holding the job's artifacts, found by content; - is stdin")
    p.add_argument("--report", metavar="PATH", help="also write the JSON report here")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    p.add_argument("--trace", metavar="PATH", help="also write a Chrome trace (chrome://tracing, Perfetto) of the job")
    p.add_argument("-v", "--verbose", action="store_true", help="print every finding's evidence")


def command(args: argparse.Namespace) -> int:
    from ddp_doctor.postmortem.analyze import analyze, trace
    from ddp_doctor.report import build as reportlib
    from ddp_doctor.report.publish import Output, publish
    missing = [p for p in args.paths if p != "-" and not os.path.exists(p)]
    if missing:
        raise UsageError(f"no such file or directory: {', '.join(missing)}")
    if args.paths.count("-") > 1:
        raise UsageError("stdin (-) can be read once")
    rep, pm = analyze(args.paths)
    out = Output(report_path=args.report, json=args.json, verbose=args.verbose, command="analyze")
    publish(rep, out, write=False)
    if args.trace:
        from ddp_doctor.report.sinks import write_trace_file
        err = write_trace_file(trace(pm, rep), args.trace)
        if err:
            from ddp_doctor.report.publish import warn
            warn(err)
    return reportlib.exit_code(rep)
