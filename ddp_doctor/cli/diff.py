"""`ddp-doctor diff GOOD BAD`: what differs between two runs' reports that matters to a distributed
job (versions, NCCL/FI and launcher variables, world layout, instance, hosts, bus bandwidth,
verdicts), most likely culprit first; the comparison itself is ddp_doctor.postmortem.run_diff.
Exit status: 0 nothing that matters differs, 3 something does, 2 a file that is not a report.
Does not import torch."""
from __future__ import annotations

import argparse
import json
from typing import Any

from ddp_doctor.cli.options import UsageError
from ddp_doctor.exit_codes import EXIT_FAILED, EXIT_OK

HELP = "list what differs between two runs' reports that matters (versions, NCCL variables, layout, bandwidth)"
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
    p.add_argument("good", metavar="GOOD", help="the report (JSON) of the run that worked")
    p.add_argument("bad", metavar="BAD", help="the report (JSON) of the run that did not")
    p.add_argument("--json", action="store_true", help="print the differences as JSON")
    p.add_argument("--bw-tolerance", metavar="PCT", type=percent, default=None,
                   help="how far bus bandwidth may move before it counts as a difference "
                        "(percent of GOOD's; default 20)")


def read_report(path: str) -> dict[str, Any]:
    """A ddp-doctor report from `path`; UsageError, one line naming the file, for anything else."""
    from ddp_doctor.facts.env_values import NotRegularFile, read_bytes
    from ddp_doctor.postmortem.run_diff import report_problem
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
    from ddp_doctor.postmortem.run_diff import DEFAULT_BW_TOLERANCE, diff_reports, render_text, to_json
    good, bad = read_report(args.good), read_report(args.bad)
    tolerance = DEFAULT_BW_TOLERANCE if args.bw_tolerance is None else args.bw_tolerance
    result = diff_reports(good, bad, bw_tolerance=tolerance)
    if args.json:
        print(json.dumps(to_json(result, args.good, args.bad), indent=2))
    else:
        print(render_text(result, args.good, args.bad))
    return EXIT_FAILED if result.matters else EXIT_OK
