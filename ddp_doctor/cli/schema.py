"""`ddp-doctor schema`: print the report's JSON Schema (draft 2020-12), or check report files
against it (`--validate PATH ...`). Neither imports torch."""
from __future__ import annotations

import argparse
import json

from ddp_doctor.cli.options import UsageError
from ddp_doctor.exit_codes import EXIT_FAILED, EXIT_OK

HELP = "print the JSON Schema of the report (draft 2020-12), or validate report files against it"


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--validate", metavar="PATH", nargs="+", default=None,
                   help="check these report files against the schema instead: one line per file, "
                        "exit 3 when any breaks it")


def command(args: argparse.Namespace) -> int:
    from ddp_doctor.report.schema import report_schema, validate_report
    if not args.validate:
        print(json.dumps(report_schema(), indent=2))
        return EXIT_OK
    code = EXIT_OK
    for path in args.validate:
        try:
            with open(path, encoding="utf-8") as f:
                report = json.load(f)
        except (OSError, ValueError) as e:
            raise UsageError(f"cannot read the report {path}: {e}")
        errors = validate_report(report)
        print(f"{path}: {'valid' if not errors else f'{len(errors)} problem(s)'}")
        for err in errors:
            print(f"  {err}")
        if errors:
            code = EXIT_FAILED
    return code
