"""`ddp-doctor sagemaker-check`: check a SageMaker training job's settings before `estimator.fit()`.

What is inside: add_parser (the flags, named like the estimator's arguments), spec_from_args
(--config file merged with the flags) and command, which runs ddp_doctor.job_check.run_checks
and shows / writes / uploads the report. Exit codes as preflight: 0 no errors, 3 errors found,
2 usage error, 1 failed.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.job_check import run_checks
from ddp_doctor.sagemaker.aws import JobContext, require_boto3
from ddp_doctor.sagemaker.spec import JobSpec, SpecError, load_spec_file


def add_parser(p: Any) -> None:
    p.add_argument("--config", metavar="FILE", help="job settings as JSON (or YAML with PyYAML), keyed "
                                                     "like the estimator's arguments; flags override it")
    p.add_argument("--instance-type", metavar="TYPE", help="e.g. ml.p4d.24xlarge")
    p.add_argument("--instance-count", metavar="N", help="number of instances (default 1)")
    p.add_argument("--distribution", metavar="JSON",
                   help='the estimator\'s distribution dict, e.g. \'{"torch_distributed": {"enabled": true}}\'')
    p.add_argument("--framework-version", metavar="V", help="PyTorch framework version, e.g. 2.3.0")
    p.add_argument("--py-version", metavar="PY", help="e.g. py311")
    p.add_argument("--entry-point", metavar="SCRIPT", help="the training script, e.g. train.py")
    p.add_argument("--role", metavar="NAME_OR_ARN", help="the execution role")
    p.add_argument("--subnets", action="append", metavar="IDS", help="subnet IDs, comma-separated or repeated")
    p.add_argument("--security-group-ids", action="append", metavar="IDS",
                   help="security group IDs, comma-separated or repeated")
    p.add_argument("--input", action="append", metavar="S3_URI", help="an input channel's S3 URI (repeatable)")
    p.add_argument("--output-path", metavar="S3_URI", help="the estimator's output_path")
    p.add_argument("--region", metavar="REGION", help="AWS region (default: boto3's)")
    p.add_argument("--profile", metavar="NAME", help="AWS profile (default: boto3's)")
    p.add_argument("--per-device-batch-size", metavar="N", help="for the effective batch size note")
    p.add_argument("--learning-rate", metavar="LR", help="the single-device learning rate, for the scaling note")
    p.add_argument("--report", metavar="PATH", help="also write the JSON report here "
                                                    "(default: $DDP_DOCTOR_REPORT when set)")
    p.add_argument("--report-s3-uri", metavar="S3_URI", help="also upload the JSON report there")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    p.add_argument("--select", action="append", metavar="X", help="run only these checks (IDs, prefixes, categories)")
    p.add_argument("--skip", action="append", metavar="X", help="skip these checks")
    p.add_argument("--verbose", "-v", action="store_true", help="show every info finding and hint")


def spec_from_args(args: Any) -> JobSpec:
    base = load_spec_file(args.config) if args.config else JobSpec()
    flags = {"instance_type": args.instance_type, "instance_count": args.instance_count,
             "distribution": args.distribution, "framework_version": args.framework_version,
             "py_version": args.py_version, "entry_point": args.entry_point, "role": args.role,
             "subnets": args.subnets, "security_group_ids": args.security_group_ids,
             "inputs": args.input, "output_path": args.output_path, "region": args.region,
             "profile": args.profile, "per_device_batch_size": args.per_device_batch_size,
             "learning_rate": args.learning_rate}
    return base.merged(flags)


def command(args: Any) -> int:
    """`ddp-doctor sagemaker-check`: 0 no errors, 3 errors found, 2 usage error, 1 failed."""
    import sys

    from ddp_doctor import checks as catalogue
    from ddp_doctor import registry
    from ddp_doctor.exit_codes import EXIT_INTERNAL, EXIT_USAGE
    from ddp_doctor.report import build as reportlib
    from ddp_doctor.report.publish import Output, publish
    try:
        require_boto3()
    except ImportError as e:
        sys.stderr.write(f"ddp-doctor sagemaker-check: error: {e}\n")
        return EXIT_INTERNAL
    try:
        spec = spec_from_args(args)
    except SpecError as e:
        sys.stderr.write(f"ddp-doctor sagemaker-check: error: {e}\n")
        return EXIT_USAGE
    select, skip = registry.parse_selectors(args.select), registry.parse_selectors(args.skip)
    bad = catalogue.unknown_selectors(select + skip)
    if bad:
        sys.stderr.write(f"ddp-doctor sagemaker-check: error: --select/--skip: {', '.join(bad)} match no "
                         f"check ID, ID prefix or category (see `ddp-doctor list-checks`)\n")
        return EXIT_USAGE
    rep = run_checks(JobContext(spec), select=select, skip=skip)
    # On a laptop: the report file only when asked for (--report or DDP_DOCTOR_REPORT).
    out = Output(report_path=args.report, json=args.json, verbose=args.verbose, report_s3_uri=args.report_s3_uri,
                 command="sagemaker-check")
    publish(rep, out, write=False)
    return reportlib.exit_code(rep)
