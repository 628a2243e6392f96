"""Where a finished report goes, by role: the reporting rank prints and writes the report; a rank
that could not join the others reports what it knows itself; failing ranks leave torchelastic's
error file and SageMaker's failure file so the platforms show the diagnosis.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ddp_doctor.exit_codes import FailOn, action_exit, exit_by_action, fail_on_exit
from ddp_doctor.report import sinks
from ddp_doctor.report.redact import redact_obj, redact_text
from ddp_doctor.report.render import coloured, render_text, verdict_line

DEFAULT_REPORT = "ddp-doctor-report.json"
REPORT_ENV = "DDP_DOCTOR_REPORT"
SM_OUTPUT_DATA_ENV = "SM_OUTPUT_DATA_DIR"  # SageMaker: /opt/ml/output/data, uploaded with the job's output


@dataclass
class Output:
    report_path: str | None = None   # --report; falls back to DDP_DOCTOR_REPORT, then DEFAULT_REPORT (path())
    json: bool = False               # --json: the report as JSON on stdout instead of text
    verbose: bool = False
    quiet: bool = False              # no text at all
    # `ddp-doctor run` keeps the script's stdout its own: text only when there is something to
    # say (status not pass), on stderr.
    only_if_not_pass: bool = False
    stderr: bool = False
    report_s3_uri: str | None = None  # --report-s3-uri; falls back to DDP_DOCTOR_REPORT_S3_URI
    command: str | None = None        # names the headline ("bench-comm"); default: the report's phase
    # `run`'s preflight: the script runs next, so a report that lets it run is written and uploaded
    # as "running" (the preflight's verdict inside), never as a "pass" for a job still to end
    running_if_pass: bool = False
    # the job's final report under `only_if_not_pass`: a pass still gets one line (status and where
    # the report is), so the user knows the job was watched
    verdict_if_pass: bool = False

    def path(self, env: Any = None) -> str:
        """--report, else DDP_DOCTOR_REPORT, else DEFAULT_REPORT in $SM_OUTPUT_DATA_DIR (SageMaker's
        directory kept with the job's output: the working directory, /opt/ml/code, goes with the
        container), else in the working directory."""
        env = os.environ if env is None else env
        kept = env.get(SM_OUTPUT_DATA_ENV)
        return (self.report_path or env.get(REPORT_ENV)
                or (os.path.join(kept, DEFAULT_REPORT) if kept else DEFAULT_REPORT))


def warn(message: str) -> None:
    _say(sys.stderr, f"ddp-doctor: warning: {redact_text(message)}\n")


def _say(stream: Any, text: str) -> None:
    """Write ddp-doctor's own text; a closed or broken stream (stderr closed, its reader gone)
    loses the text, never the report or the exit status."""
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError, AttributeError):
        pass


def upload_report(rep: dict[str, Any], out: Output, env: Any = None, suffix: str = "",
                  stop: Callable[[float], Any] | None = None) -> Any:
    """Upload the report to S3 when asked (--report-s3-uri or DDP_DOCTOR_REPORT_S3_URI); a failure
    is a warning on stderr and never changes the exit code. The upload is bounded as a whole
    (report/s3.py DEADLINE_S); `stop(s)` waits up to s seconds for a stop signal and returns it:
    one that comes during the upload cuts it short and is returned (else None)."""
    env = os.environ if env is None else env
    uri = out.report_s3_uri or env.get("DDP_DOCTOR_REPORT_S3_URI")
    if not uri:
        return None
    came: list[Any] = []

    def wait(seconds: float) -> Any:
        got = stop(seconds) if stop is not None else None
        if got:
            came.append(got)
        return got

    try:
        from ddp_doctor.report.s3 import upload_report as s3_upload
        err = s3_upload(rep, uri, env=env, suffix=suffix, stop=wait if stop is not None else None)
    except Exception as e:  # noqa: BLE001 - a sink never takes the run down
        err = f"could not upload the report to {uri}: {type(e).__name__}: {e}"
    if err:
        warn(err)
    return came[0] if came else None


def show(rep: dict[str, Any], out: Output, path: str | None, stream: Any = None, prefix: str = "") -> None:
    passed = out.only_if_not_pass and rep.get("status") == "pass"
    if out.quiet or (passed and not out.verdict_if_pass):
        return
    stream = stream or (sys.stderr if out.stderr else sys.stdout)
    if passed:
        text = redact_text(verdict_line(rep, report_path=path, command=out.command))
    elif out.json:
        text = sinks.report_json(redact_obj(rep))
    else:
        text = redact_text(render_text(rep, report_path=path, verbose=out.verbose, command=out.command))
    if prefix:
        text = "\n".join(prefix + line for line in text.splitlines())
    elif not out.json and wants_colour(stream):
        text = coloured(text)
    _say(stream, text + "\n")


def wants_colour(stream: Any, env: Any = None) -> bool:
    """Colour for a terminal, unless NO_COLOR is set to anything but "" (no-color.org)."""
    if (os.environ if env is None else env).get("NO_COLOR"):
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def publish(rep: dict[str, Any], out: Output, *, env: Any = None, path: str | None = None,
            write: bool = True, suffix: str = "", stream: Any = None, prefix: str = "",
            stop: Callable[[float], Any] | None = None,
            stopped: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None,
            evidence: dict[str, Any] | None = None) -> str | None:
    """The one way a finished report leaves ddp-doctor: write it to its file (`path`, else --report,
    DDP_DOCTOR_REPORT or the default; `write=False` writes only a path that was asked for), warn
    when that failed, show it as `out` asks, and upload it when S3 is asked for. The file is written
    with the final status before any upload is awaited. A parent that holds the stop signals passes
    `stop` (a wait for the next one: SignalCatcher.wait_new) and `stopped` (the report a stop makes
    of this one): a stop during the upload of a report not already "interrupted" cuts it short and
    the file is written again, "interrupted"; a stop during the history's write (last, and only an
    aid) cuts that short whatever the report says. `evidence`: what the verdict was judged from
    (training/evidence_file.py), written beside a report file written to a plain path.
    Returns the path written, None when none was."""
    env = os.environ if env is None else env
    path = path or (out.path(env) if write else out.report_path or env.get(REPORT_ENV))
    kept = rep
    if out.running_if_pass and rep.get("status") in ("pass", "warn"):
        from ddp_doctor.report.build import mark_running
        kept = mark_running(rep)
    if path:
        err = sinks.write_report_file(kept, path)
        if err:
            warn(err)
            path = None
        else:  # an evidence file left by an earlier report at this path would be taken for this one's
            write_evidence_beside(evidence, path) if evidence is not None else sinks.remove_evidence_file(path)
    show(rep, out, path, stream=stream, prefix=prefix)
    # a stop cuts short the upload of a report it changes; one that says "interrupted" already is
    # uploaded whole (the stop is noted by the caller afterwards)
    came = upload_report(kept, out, env, suffix=suffix, stop=stop if rep.get("status") != "interrupted" else None)
    if came is not None and stopped is not None:
        rep = stopped(rep, came)
        if path:
            err = sinks.write_report_file(rep, path)
            if err:
                warn(err)
        status = rep.get("status")
        said = f"; {path} says {status}" if path else ""
        _say(sys.stderr, f"ddp-doctor: {came.describe()} during the report's upload: the upload was cut short{said}\n")
    if not suffix:  # a rank's own partial report (suffix ".rankN") is not the job's
        from ddp_doctor.history.from_report import record
        why_not = record(rep, env, stop=stop)
        if why_not:
            warn(why_not)
    return path


def write_evidence_beside(evidence: dict[str, Any], report_path: str) -> None:
    """The evidence file beside the report at `report_path` (a plain path: not /dev/stdout, not a pipe)."""
    err = sinks.write_evidence_file(evidence, report_path)
    if err:
        warn(err)


def apply_fail_on(code: int, rep: dict[str, Any], fail_on: FailOn | None) -> int:
    """The exit status under --fail-on / DDP_DOCTOR_FAIL_ON (None: not asked), by the one rule
    (exit_codes.fail_on_exit), then under --exit-by-action / DDP_DOCTOR_EXIT_BY_ACTION
    (exit_codes.action_exit); when it changed, one stderr line says why."""
    new, line = fail_on_exit(code, rep, fail_on)
    if line:
        _say(sys.stderr, line + "\n")
    new, line = action_exit(new, rep, exit_by_action(os.environ))
    if line:
        _say(sys.stderr, line + "\n")
    return new


def platform_sinks(rep: dict[str, Any], env: Mapping[str, str], sm: Any, say: bool = True) -> None:
    """On failure: torchelastic's error file (torchrun's summary names it) and, on SageMaker (`sm`:
    the container's view, None elsewhere), the failure file (first writer wins) and, with `say`, a
    stderr line naming an exception (one process of a host says it: the toolkit reads each host's)."""
    if rep.get("status") != "fail":
        return
    err = sinks.write_torchelastic_error_file(rep, env.get("TORCHELASTIC_ERROR_FILE"))
    if err:
        warn(err)
    if sm is not None:
        err = sinks.write_sagemaker_failure(rep, sm.root)
        if err and "already" not in err:
            warn(err)
        if say:
            _say(sys.stderr, sinks.sm_failure_line(rep) + "\n")


def deliver(rep: dict[str, Any], ctx: Any, out: Output, *, reporter: bool, alone: bool = False,
            launch_dir: str | None = None) -> None:
    if launch_dir:
        # Self-launched: the parent merges and prints; ranks only leave files.
        if reporter:
            err = sinks.write_report_file(rep, os.path.join(launch_dir, sinks.LAUNCH_REPORT_FILE), private=True)
            if err:
                warn(err)
        return
    rank = ctx.rank if ctx.rank is not None else 0
    path = out.path(ctx.env)
    if reporter:
        publish(rep, out, env=ctx.env, path=path)
    elif alone:
        if rank != 0 and not os.path.exists(path):
            sinks.write_report_file(rep, path)  # so PATH exists in every outcome; rank 0 overwrites
        publish(rep, out, env=ctx.env, path=path if rank == 0 else f"{path}.rank{rank}.json",
                suffix="" if rank == 0 else f".rank{rank}", stream=sys.stdout if rank == 0 else sys.stderr,
                prefix="" if rank == 0 else f"[rank {rank}] ")
    # one line per host for the toolkit: the reporting rank's, else the host's local rank 0's
    platform_sinks(rep, ctx.env, ctx.sagemaker, say=reporter or alone or ctx.local_rank in (0, None))
