"""`ddp-doctor analyze PATH...`: the post-mortem of a job that ran without ddp-doctor, from the
artifacts it left (logs, torchrun's log tree, error files, flight-recorder dumps): the report of
`ddp-doctor run`, made afterwards. `ddp-doctor analyze X.evidence.json` judges again the evidence a
report was judged from (written beside it: training/evidence_file.py). `--sagemaker-job NAME`
adds what AWS kept of a SageMaker training job (its description, its hosts' CloudWatch streams:
ddp_doctor.sagemaker.job_logs).
Exit status: 0 no error found, 3 errors found, 2 usage error, 1 the job's logs could not be read,
128 + N a stop signal N (SIGTERM, SIGINT, SIGHUP).

A stop signal is held from the command's first instruction (cli) and taken here: it ends the
reading or the wait on AWS at once (SignalCatcher.interrupting), and the report, written whole
(atomically, the signals still held), says "interrupted" with what the analysis was doing (DDP955):
never a verdict from part of the artifacts, never a partial file. A stop that comes once the
analysis has ended leaves its verdict whole (DDP955, info) and the exit status 128 + N."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

from ddp_doctor.cli.options import UsageError

HELP = "diagnose a job that already ended from the artifacts it left (logs, torchrun --log-dir, error files, dumps)"


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", metavar="PATH", nargs="*",
                   help="files or directories (walked) holding the job's artifacts, found by content; - is stdin; "
                        "or one evidence file (X.evidence.json, written beside a report) to judge again")
    p.add_argument("--sagemaker-job", metavar="NAME",
                   help="a SageMaker training job: read its description and its hosts' CloudWatch logs "
                        "(needs boto3: the aws extra); PATHs may add more artifacts")
    p.add_argument("--region", metavar="REGION", help="the AWS region of --sagemaker-job (default: boto3's)")
    p.add_argument("--instance-type", metavar="TYPE",
                   help="the job's instance type (p4d.24xlarge, ml.p5.48xlarge), for the rules that need the "
                        "hardware (NCCL on sockets on an EFA instance); --sagemaker-job reads it from the job")
    p.add_argument("--report", metavar="PATH", help="also write the JSON report here")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    p.add_argument("--trace", metavar="PATH", help="also write a Chrome trace (chrome://tracing, Perfetto) of the job")
    p.add_argument("-v", "--verbose", action="store_true", help="print every finding's evidence")


def command(args: argparse.Namespace) -> int:
    from ddp_doctor.postmortem.analyze import analyze, trace
    from ddp_doctor.report.publish import Output, publish
    if not args.paths and not args.sagemaker_job:
        raise UsageError("give the job's artifacts (PATH...), --sagemaker-job NAME, or both")
    if args.region and not args.sagemaker_job:
        raise UsageError("--region goes with --sagemaker-job")
    missing = [p for p in args.paths if p != "-" and not os.path.exists(p)]
    if missing:
        raise UsageError(f"no such file or directory: {', '.join(missing)}")
    odd = [f"{p} is {kind}" for p in args.paths if p != "-" and (kind := _not_file_or_dir(p))]
    if odd:  # read, it would never end (a device) or wait for a writer (a FIFO): - reads a stream
        raise UsageError(f"{'; '.join(odd)}, not a regular file or a directory: analyze reads "
                         "files and directories (- for stdin)")
    if args.paths.count("-") > 1:
        raise UsageError("stdin (-) can be read once")
    from ddp_doctor.training.evidence_file import is_evidence_file
    replayed = [p for p in args.paths if p != "-" and is_evidence_file(p)]
    if replayed and (len(args.paths) > 1 or args.sagemaker_job):
        raise UsageError(f"{replayed[0]} is an evidence file: it is judged alone (give it as the only PATH)")
    from ddp_doctor.postmortem.artifacts import Artifacts
    from ddp_doctor.processes.stop_signals import SignalCatcher, Stopped, note_later
    out = Output(report_path=args.report, json=args.json, verbose=args.verbose, command="analyze")
    # SIGTERM/SIGINT/SIGHUP: held since the first instruction, blocked from here to the exit
    with SignalCatcher(hold=True) as stop:
        art = Artifacts()  # how far the reading got, if a stop ends it
        try:
            if replayed:
                made = _replay(replayed[0])
            elif args.sagemaker_job:
                made = _sagemaker_job(args, analyze, stop, art)
            else:
                with stop.interrupting():
                    made = analyze(args.paths, world=_given(args), art=art)
        except Stopped:
            made = _interrupted(args, art, stop)
        if isinstance(made, int):  # the job's logs could not be read: no report
            stop.drain()
            note_later(stop.later, "after the analysis had ended")
            first = stop.first()
            return first.exit_code if first is not None else made
        rep, pm = made
        if pm is not None:  # the analysis ended: a stop since then leaves its verdict whole
            rep = _late_stops(rep, stop)
        publish(rep, out, write=False, stop=stop.wait_new, stopped=_stopped_during_upload)
        note_later(stop.drain(), "while the report was written; it was written first")
        if args.trace and pm is not None:
            from ddp_doctor.report.sinks import write_trace_file
            err = write_trace_file(trace(pm, rep), args.trace)
            if err:
                from ddp_doctor.report.publish import warn
                warn(err)
        elif args.trace:
            _say(f"ddp-doctor analyze: no trace written to {args.trace}: the analysis was stopped before its end")
    first = stop.first()  # the exit status a stop signal asks for, whenever it came
    return first.exit_code if first is not None else verdict_exit_code(rep)


def verdict_exit_code(rep: dict[str, Any]) -> int:
    """analyze's own status, never the analysed job's (a job stopped by SIGTERM does not make
    analyze exit 143): 0 when no failure was found (pass, warn), 3 when one was (a job that failed,
    was stopped or hung, or whose logs end while it ran)."""
    from ddp_doctor.exit_codes import EXIT_FAILED, EXIT_OK
    return EXIT_OK if rep.get("status") in ("pass", "warn") else EXIT_FAILED


def _replay(path: str) -> tuple[dict[str, Any], Any] | int:
    """The verdict judged again from an evidence file, or the exit status when it cannot be read.
    A verdict other than the one the file recorded (a ddp-doctor whose rules changed) is said."""
    from ddp_doctor.exit_codes import EXIT_USAGE
    from ddp_doctor.postmortem.analyze import replay
    from ddp_doctor.training.evidence_file import NotEvidence
    try:
        rep, pm, recorded = replay(path)
    except NotEvidence as e:  # bad input
        _say(f"ddp-doctor analyze: error: {e}")
        return EXIT_USAGE
    now, then = _verdict_line(rep.get("status"), rep.get("root_cause")), _verdict_line(
        recorded.get("status"), recorded.get("root_cause"))
    if recorded and now != then:
        _say(f"ddp-doctor analyze: {path} was judged {then} when it was written; this ddp-doctor judges it {now}")
    return rep, pm


def _verdict_line(status: Any, root: Any) -> str:
    root = root if isinstance(root, dict) else {}
    ranks = ",".join(str(r) for r in root.get("ranks") or [])
    return f"{status}" + (f" ({root.get('id')} on rank(s) {ranks})" if root.get("id") else "")


def _interrupted(args: argparse.Namespace, art: Any, stop: Any) -> tuple[dict[str, Any], None]:
    """The report of an analysis a stop signal ended: status "interrupted", the signal and what the
    analysis was doing (DDP955), how many inputs it had read; no verdict on the job."""
    from ddp_doctor.checks.post_mortem import analysis_stopped_finding
    from ddp_doctor.processes.stop_signals import note_later
    from ddp_doctor.report import build as reportlib
    note_later(stop.drain(), "while the analysis was being stopped; noted in the report")
    caught = stop.stopped()
    stage = art.stage or "starting, before it read any input"
    world: dict[str, Any] = {"source": "post-mortem", **(_given(args) or {})}
    if args.sagemaker_job:
        world["platform"] = "sagemaker"
    measured = {"post_mortem": {"finished": False, "stage": stage, "inputs_read": len(art.read),
                                "inputs_skipped": len(art.skipped)}}
    rep = reportlib.build_report(world=world, ranks=[], phase="training", measurements=measured,
                                 findings=[analysis_stopped_finding(caught, stage, len(art.read), len(art.skipped))])
    return reportlib.mark_interrupted(rep, caught.to_dict()), None


def _late_stops(rep: dict[str, Any], stop: Any) -> dict[str, Any]:
    """The finished analysis's report, with a stop signal that came as it ended noted (DDP955,
    info): its verdict stands, the exit status will be 128 + N."""
    stop.drain()  # with any the watcher took as the work ended (interrupting)
    if not stop.later:
        return rep
    from ddp_doctor.checks.post_mortem import late_analysis_stop_finding
    from ddp_doctor.processes.stop_signals import note_later
    note_later(stop.later, "after the analysis had ended; noted in the report (DDP955)")
    return _with_finding(rep, late_analysis_stop_finding(stop.later[0]))


def _stopped_during_upload(rep: dict[str, Any], caught: Any) -> dict[str, Any]:
    """The report a stop signal makes of a finished one while its S3 upload was awaited: the
    verdict's findings kept, the stop noted (DDP955, info), status "interrupted", as `preflight`."""
    if rep.get("status") == "interrupted":
        return rep
    from ddp_doctor.checks.post_mortem import late_analysis_stop_finding
    from ddp_doctor.report import build as reportlib
    return reportlib.mark_interrupted(_with_finding(rep, late_analysis_stop_finding(caught)), caught.to_dict())


def _with_finding(rep: dict[str, Any], finding: Any) -> dict[str, Any]:
    from ddp_doctor.report import build as reportlib
    kept = {k: v for k, v in rep.items() if k not in ("status", "findings", "root_cause", "summary")}
    new = reportlib.build_report(world=rep.get("world") or {}, ranks=rep.get("ranks") or [],
                                 measurements=rep.get("measurements") or {}, phase=rep.get("phase") or "training",
                                 findings=[*reportlib.findings_of(rep), finding])
    return {**kept, **new}


def _not_file_or_dir(path: str) -> str | None:
    """What a path given explicitly is when analyze cannot read it (a FIFO, a device, a socket)."""
    from ddp_doctor.facts.env_values import not_regular
    try:
        kind = not_regular(path)
    except OSError:
        return None  # gone since it was seen: the read names it
    return None if kind == "a directory" else kind


def _given(args: argparse.Namespace) -> dict[str, Any] | None:
    """What the command line says of the job's hardware (it overrides the platform's)."""
    return {"instance_type": args.instance_type, "instance_type_from": "--instance-type"} if args.instance_type \
        else None


REASON_SHOWN = 300  # characters of the job's FailureReason in the line on stderr


def _sagemaker_job(args: argparse.Namespace, analyze: Any, stop: Any, art: Any) -> tuple[dict[str, Any], Any] | int:
    """The report of the SageMaker job (and any PATHs), or the exit status when its logs could not
    be read. Its streams go into a private temporary directory, removed once they are read. A stop
    signal ends the fetch or the reading (stop.interrupting), never the directory's removal."""
    from ddp_doctor.exit_codes import EXIT_INTERNAL
    from ddp_doctor.sagemaker.job_logs import JobLogsError, fetch_job_logs
    art.stage = f"fetching SageMaker job {args.sagemaker_job}'s description and logs from AWS"
    with tempfile.TemporaryDirectory(prefix="ddp-doctor-sagemaker-") as tmp, stop.interrupting():  # mode 0700
        try:
            logs = fetch_job_logs(args.sagemaker_job, tmp, region=args.region)
        except JobLogsError as e:
            if e.usage:
                raise UsageError(str(e)) from None
            _say(f"ddp-doctor analyze: error: {e}")
            return EXIT_INTERNAL
        except OSError as e:  # the temporary directory: a full disk, a quota
            _say(f"ddp-doctor analyze: error: could not write the job's logs to {tmp}: {e.strerror or e}")
            return EXIT_INTERNAL
        read = logs.read
        ended = logs.status or "status unknown"
        if logs.failure_reason:  # up to 1,024 characters: the report keeps it whole
            reason = " ".join(logs.failure_reason.split())
            ended += f": {reason if len(reason) <= REASON_SHOWN else reason[:REASON_SHOWN] + '...'}"
        if not read and not args.paths:
            # Nothing to judge: a report would say "pass" about a job that may have failed before it
            # wrote a line (capacity, image, permissions), or whose logs expired.
            _say(f"ddp-doctor analyze: error: SageMaker job {logs.job} ({ended}) has no log streams in "
                 f"{logs.region} under /aws/sagemaker/TrainingJobs/{logs.job}/: nothing to analyze")
            return EXIT_INTERNAL
        cut = [s.name for s in logs.streams if s.truncated]
        more = f" and {len(cut) - 5} more" if len(cut) > 5 else ""
        _say(f"ddp-doctor analyze: SageMaker job {logs.job} in {logs.region} ({ended}): read {len(read)} "
             f"stream(s), {sum(s.events for s in read)} event(s), {sum(s.bytes for s in read)} bytes"
             + (f"; cut by a bound (the report says why): {', '.join(cut[:5])}{more}" if cut else "")
             + (f"; {logs.cut_short}" if logs.cut_short else ""))
        try:
            rep, pm = analyze([*args.paths, tmp], world={**logs.world(), **(_given(args) or {})},
                              extra={"sagemaker": logs.summary()}, art=art)
        except BaseException:  # the stage names the streams, not the files removed with the directory
            art.stage = _named_streams(art.stage, tmp, {os.path.basename(s.file): s.name for s in read if s.file})
            raise
    return _named_streams(rep, tmp, {os.path.basename(s.file): s.name for s in read if s.file}), pm


def _named_streams(value: Any, tmp: str, streams: dict[str, str]) -> Any:
    """The report with the temporary files (removed by now) named as the streams they hold."""
    if isinstance(value, dict):
        return {k: _named_streams(v, tmp, streams) for k, v in value.items()}
    if isinstance(value, list):
        return [_named_streams(v, tmp, streams) for v in value]
    if isinstance(value, str) and tmp in value:
        for file, stream in streams.items():
            value = value.replace(os.path.join(tmp, file), f"cloudwatch:/aws/sagemaker/TrainingJobs/{stream}")
        return value.replace(tmp, "cloudwatch:/aws/sagemaker/TrainingJobs")
    return value


def _say(line: str) -> None:
    """One line of ddp-doctor's own on stderr, secrets removed (an AWS message may quote a request)."""
    from ddp_doctor.report.redact import redact_text
    sys.stderr.write(redact_text(line) + "\n")
