"""`ddp-doctor diff GOOD BAD`: did the BAD run get worse than the GOOD one? Its figures (bus bandwidth,
step time, wrong results) judged against each pair's noise band, its verdict (status, root cause,
findings), then what else differs that could be why (versions, NCCL/FI and launcher variables, world
layout, instance, hosts), most likely culprit first; the comparison itself is
ddp_doctor.postmortem.report_diff. Exit status: 0 nothing got worse (identical, within noise, better,
or only settings differ), 3 something got worse, 2 a file that is not a report. Does not import
torch."""
from __future__ import annotations

import argparse
import json
from typing import Any

from ddp_doctor.cli.options import UsageError
from ddp_doctor.exit_codes import EXIT_FAILED, EXIT_OK

HELP = ("compare two runs' reports: what got worse beyond noise (exit 3), what got better, and what differs "
        "(versions, NCCL variables, layout)")
MAX_REPORT_BYTES = 256 << 20  # a report is kilobytes to a few megabytes; anything this big is not one


def percent(text: str) -> float:
    """An argparse type: a tolerance in percent ("20", "20%"), returned as a fraction."""
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage") from None
    if not 0 <= value < 1e6:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text!r} must be a percentage of at least 0")
    return value / 100.0


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("good", metavar="GOOD", help="the report (JSON) of the run that worked (the baseline)")
    p.add_argument("bad", metavar="BAD", help="the report (JSON) of the run judged against it")
    p.add_argument("--json", action="store_true", help="print the differences as JSON, each with its change "
                   "(worse, better, within_noise, changed) and a figure's noise band")
    p.add_argument("--bw-tolerance", metavar="PCT", type=percent, default=None,
                   help="the least noise band of the bus bandwidth figures, in percent of GOOD's (default: 25 "
                        "for figures measured on CPU or of fewer than 5 timed iterations, else 10); each run's own "
                        "spread over the sizes near the compared one widens it")


def read_report(path: str) -> dict[str, Any]:
    """A ddp-doctor report from `path`; UsageError, one line naming the file, for anything else."""
    from ddp_doctor.facts.env_values import NotRegularFile, read_bytes
    from ddp_doctor.postmortem.report_diff import report_problem
    try:
        data = read_bytes(path, MAX_REPORT_BYTES)  # a regular file only: a FIFO or a device is never opened
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}")
    except NotRegularFile as e:
        raise UsageError(f"cannot read {path}: it is {e} (diff reads two report files)")
    except ValueError:
        raise UsageError(f"{path}: not a ddp-doctor report (over {MAX_REPORT_BYTES >> 20} MiB)")
    try:
        report = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UsageError(f"{path}: not a ddp-doctor report (not JSON: {str(e).splitlines()[0][:200]})")
    problem = report_problem(report)
    if problem:
        raise UsageError(f"{path}: {problem}")
    return report


def command(args: argparse.Namespace) -> int:
    from ddp_doctor.postmortem.report_diff import diff_reports, render_text, to_json
    good, bad = read_report(args.good), read_report(args.bad)
    result = diff_reports(good, bad, bw_tolerance=args.bw_tolerance)
    if args.json:
        print(json.dumps(to_json(result, args.good, args.bad), indent=2))
    else:
        print(render_text(result, args.good, args.bad))
    return EXIT_FAILED if result.worse else EXIT_OK  # worse, not merely different
