"""Sinks: where a finished report goes (JSON file, SageMaker failure file, torchelastic error file,
a stderr line for the SageMaker toolkit).

Every sink redacts secrets before writing and never raises: a problem comes back as a short error
string (None on success), which the caller turns into a warning. A sink that cannot write must not
hide the diagnosis the job is about to fail with.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from ddp_doctor.findings import format_ranks
from ddp_doctor.report.private_files import write_atomically
from ddp_doctor.report.redact import redact_obj, redact_text
from ddp_doctor.report.schema import TEST_ERRORS_ENV, record_if_invalid

LAUNCH_REPORT_FILE = "report.json"  # the reporting rank's report in a launch directory (processes/launch_dir.py)
EXCEPTION_NAME = "DDPDoctorPreflightError"
EXCEPTION_NAMES = {"preflight": EXCEPTION_NAME, "training": "DDPDoctorTrainingError",
                   "teardown": "DDPDoctorTeardownError"}


def exception_name(report: dict[str, Any]) -> str:
    """The exception class named in error files and on stderr, by the report's phase."""
    return EXCEPTION_NAMES.get(str(report.get("phase")), EXCEPTION_NAME)
# SageMaker keeps the first 1024 characters of output/failure as FailureReason and the toolkit may
# prepend a header: keep the diagnosis within the first 900.
FAILURE_LIMIT = 900
SM_REPORT_NAME = "ddp-doctor-report.json"
ALREADY_WRITTEN = "failure file already written by another process"
ELLIPSIS = "…"


def _one_line(value: Any) -> str:
    return " ".join(str(value if value is not None else "").split())


def _truncate(text: str, limit: int) -> str:
    """Cut at a word boundary and mark the cut; only a very long word is cut inside."""
    if len(text) <= limit:
        return text
    if limit <= len(ELLIPSIS):
        return text[:limit]
    cut = text[: limit - len(ELLIPSIS)]
    space = cut.rfind(" ")
    if space >= len(cut) * 0.6:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + ELLIPSIS


def _ranks_text(ranks: Any) -> str:
    try:
        rs = [int(r) for r in ranks or ()]
    except (TypeError, ValueError):
        return ""
    if not rs:
        return ""
    return f" on rank{'s' if len(set(rs)) > 1 else ''} {format_ranks(rs)}"


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("id", "message", "hint"))


def _diagnosis(report: dict[str, Any], limit: int) -> str:
    status = _one_line(report.get("status") or "fail")
    findings = [f for f in report.get("findings") or [] if isinstance(f, dict)]
    errors = [f for f in findings if f.get("severity") == "error"]
    cause = report.get("root_cause") if isinstance(report.get("root_cause"), dict) else None
    cause = cause or (errors[0] if errors else None)
    if cause is None:
        warnings = [f for f in findings if f.get("severity") == "warning"]
        head = f"ddp-doctor: {status}: no errors, {len(warnings)} warning(s)."
        others, label = warnings, "Warnings:"
    else:
        # the action first, so a cut paragraph (a platform's failure reason) still says what to do
        action = _one_line(cause.get("action")) if cause.get("action") else ""
        hosts = " " + ", ".join(map(_one_line, cause.get("hosts") or [])) if action == "exclude_host" else ""
        act = f" (action: {action}{hosts.rstrip()})" if action else ""
        head = (f"ddp-doctor: {status}{act}: [{_one_line(cause.get('id'))}] {_one_line(cause.get('title'))}"
                f"{_ranks_text(cause.get('ranks'))}: {_one_line(cause.get('message'))}")
        hint = _one_line(cause.get("hint"))
        if hint:
            head += f" Fix: {hint}"
        others, label = [f for f in errors if not _same(f, cause)], "Other errors:"
    if len(head) >= limit or not others:
        return _truncate(head, limit)
    # The root cause is whole; add the other findings (ID and title) while they fit.
    text = head
    for i, f in enumerate(others):
        item = f"[{_one_line(f.get('id'))}] {_one_line(f.get('title'))}{_ranks_text(f.get('ranks'))}"
        piece = (f" {label} " if i == 0 else "; ") + item
        left = len(others) - i - 1
        more = f" (+{left} more)" if left else ""
        if len(text) + len(piece) + len(more) > limit:
            more = f" (+{len(others) - i} more)"
            return text + more if len(text) + len(more) <= limit else text
        text += piece
    return text


def diagnosis_text(report: dict[str, Any], limit: int = FAILURE_LIMIT) -> str:
    """One paragraph, root cause first: "ddp-doctor: fail (action: A): [ID] title on rank(s) R:
    message Fix: hint", then the other errors' IDs and titles while they fit within `limit` characters."""
    try:
        return _diagnosis(redact_obj(report), limit)
    except Exception as e:  # noqa: BLE001 - a malformed report must still give a failure message
        return _truncate(f"ddp-doctor: {_one_line(report.get('status') if isinstance(report, dict) else '?')}: "
                         f"report could not be summarised ({type(e).__name__})", limit)


def _atomic_write(path: str, text: str, mode: int = 0o644) -> None:
    """The sinks' atomic write (private_files.write_atomically, fsynced): `mode` 0600 for a file
    left in a run directory, 0644 for a report meant to be read by others. A path that is not a
    file to replace (`/dev/null`, `/dev/stdout`, a pipe) is written into instead: a rename over it
    would put a plain file in place of the device, for every process on the machine."""
    if _not_a_file(path):
        # no O_CREAT: it exists; O_NONBLOCK: a FIFO nobody reads is an error, not a wait
        import fcntl
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)  # a reader is there
            data = memoryview(text.encode("utf-8"))
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomically(path, text, mode=mode, durable=True)


def _not_a_file(path: str) -> bool:
    """The path names a device, a pipe or a socket, or a descriptor's target (/dev/stdout is a link
    to /proc/self/fd/1): judged by what it is, so a plain file in /dev/shm is still replaced whole."""
    import stat
    if path.startswith("/proc/") or (os.path.islink(path) and os.readlink(path).startswith("/proc/")):
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _error(what: str, path: str, e: BaseException) -> str:
    return f"could not write {what} {path}: {type(e).__name__}: {e}"


def report_json(report: dict[str, Any]) -> str:
    """The report as JSON text, indented as `json.dumps(indent=2)` writes it but for two things
    that keep a 4,096-rank report small and readable: a list of plain values (a finding's
    `ranks`) is one line, and so is each rank's entry in the report's `ranks`. The same JSON
    value, whatever the whitespace (the file, `--json`, S3)."""
    def text(value: Any, depth: int, one_line_items: bool = False) -> str:
        pad = "  " * depth
        if isinstance(value, dict) and value:
            items = [f"{pad}  {_key(k)}: {text(v, depth + 1, depth == 0 and k == 'ranks')}" for k, v in value.items()]
            return "{\n" + ",\n".join(items) + f"\n{pad}}}"
        if isinstance(value, (list, tuple)) and value and not all(_plain(v) for v in value):
            items = [f"{pad}  {json.dumps(v, default=str) if one_line_items else text(v, depth + 1)}" for v in value]
            return "[\n" + ",\n".join(items) + f"\n{pad}]"
        return json.dumps(value, default=str)
    return text(report, 0)


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _key(key: Any) -> str:
    """A dict key as json.dumps writes it (a number or None becomes a string)."""
    return json.dumps(key) if isinstance(key, str) else json.dumps({key: 0})[1:-4]


def write_report_file(report: dict[str, Any], path: str, *, private: bool = False) -> str | None:
    """Write the (redacted) JSON report atomically, creating parent directories; `private`: 0600
    (a rank's report left in a run directory for the parent), else 0644.
    Returns None on success, else the error text."""
    try:
        text = report_json(redact_obj(report)) + "\n"
        if os.environ.get(TEST_ERRORS_ENV):  # the test suite only: every report written is validated
            record_if_invalid(text, path)
        _atomic_write(path, text, 0o600 if private else 0o644)
        return None
    except Exception as e:  # noqa: BLE001 - a sink never raises: the caller says the error text
        return _error("report", path, e)


EVIDENCE_SUFFIX = ".evidence.json"


def evidence_path(report_path: str) -> str:
    """Where the evidence file of the report at `report_path` goes: `X.json` -> `X.evidence.json`."""
    root, ext = os.path.splitext(report_path)
    return (root if ext == ".json" else report_path) + EVIDENCE_SUFFIX


def write_evidence_file(evidence: dict[str, Any], report_path: str) -> str | None:
    """Write what a verdict was judged from (training/evidence_file.py) beside the report at
    `report_path`, redacted and atomically; nothing beside a report written to a device or a pipe
    (/dev/stdout). Returns None on success or when nothing is written, else the error text."""
    if _not_a_file(report_path):
        return None
    path = evidence_path(report_path)
    try:
        _atomic_write(path, json.dumps(redact_obj(evidence), default=str, separators=(",", ":")) + "\n")
        return None
    except Exception as e:  # noqa: BLE001 - a sink never raises: the caller says the error text
        return _error("evidence file", path, e)


def remove_evidence_file(report_path: str) -> None:
    """Remove the evidence file beside the report at `report_path`, if there is one ddp-doctor wrote
    (it names its schema early): a report written without evidence must not be paired with an
    earlier report's."""
    path = evidence_path(report_path)
    try:
        if _not_a_file(report_path) or not os.path.isfile(path) or os.path.islink(path):
            return
        with open(path, "rb") as f:
            if b'"ddp-doctor.evidence"' not in f.read(256):
                return
        os.unlink(path)
    except OSError:
        return  # another writer's file, or gone: nothing of ours to remove


def write_trace_file(trace: dict[str, Any], path: str, *, private: bool = False) -> str | None:
    """Write a Chrome trace (report/chrome_trace.py; redacted, since it carries exception messages and
    call sites) atomically, creating parent directories; `private`: 0600 (the copy in a kept run
    directory). None on success, else the error text."""
    try:
        _atomic_write(path, json.dumps(redact_obj(trace), default=str) + "\n", 0o600 if private else 0o644)
        return None
    except Exception as e:  # noqa: BLE001 - a sink never raises: the caller says the error text
        return _error("trace", path, e)


def write_sagemaker_failure(report: dict[str, Any], root: str = "/opt/ml") -> str | None:
    """On a failed report: the diagnosis to <root>/output/failure (exclusively: the first writer
    wins, as with the toolkit) and the full report to <root>/output/data/ddp-doctor-report.json.
    Returns None, or the error text / a note that another process wrote the failure file first."""
    if report.get("status") != "fail":
        return None
    problems: list[str] = []
    failure = os.path.join(root, "output", "failure")
    try:
        os.makedirs(os.path.dirname(failure), exist_ok=True)
        data = diagnosis_text(report, FAILURE_LIMIT).encode("utf-8")
        fd = os.open(failure, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except FileExistsError:
        problems.append(ALREADY_WRITTEN)
    except Exception as e:  # noqa: BLE001 - the report file below is still written
        problems.append(_error("SageMaker failure file", failure, e))
    err = write_report_file(report, os.path.join(root, "output", "data", SM_REPORT_NAME))
    if err:
        problems.append(err)
    return "; ".join(problems) or None


def torchelastic_error_data(report: dict[str, Any], timestamp: float | None = None) -> dict[str, Any]:
    """The error file torch's ErrorHandler.record_exception writes. torchrun's failure summary
    prints `py_callstack` (not `message`) as the root cause's "traceback": the diagnosis alone,
    one paragraph (the report itself is printed once, by the rank that wrote it, and kept in its file)."""
    safe = redact_obj(report)
    line = f"{exception_name(safe)}: {diagnosis_text(safe)}"
    callstack = redact_text(f"{line}\n")
    return {"message": {"message": line, "extraInfo": {
        "py_callstack": callstack,
        "timestamp": str(int(time.time() if timestamp is None else timestamp)),
    }}}


def write_torchelastic_error_file(report: dict[str, Any], path: str | None = None) -> str | None:
    """On a failed report, write torchelastic's error file (default: $TORCHELASTIC_ERROR_FILE;
    nothing when unset) so torchrun names our diagnosis as the root cause. Like torch's own
    handler it replaces an existing file. The caller still has to exit non-zero."""
    path = path or os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or report.get("status") != "fail":
        # A passing preflight must leave no error file: the agent would read it as the cause of a
        # later training failure.
        return None
    try:
        _atomic_write(path, json.dumps(torchelastic_error_data(report)))
        return None
    except Exception as e:  # noqa: BLE001 - a sink never raises: the caller says the error text
        return _error("torchelastic error file", path, e)


def sm_failure_line(report: dict[str, Any]) -> str:
    """One stderr line for the SageMaker toolkit, which captures stderr into FailureReason from
    the first line containing a known exception name (its list has RuntimeError but would not match
    our own class name alone)."""
    return f"{exception_name(report)} (RuntimeError): {diagnosis_text(report, 300)}"
