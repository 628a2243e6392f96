"""Every ddp-doctor report a test session leaves on disk follows the report's JSON Schema: the
suite's last check (a pytest plugin; tests/conftest.py loads its hooks).

tests/conftest.py validates each report as ddp-doctor writes it, where the writer's environment
carries the hook (report/schema.py, TEST_ERRORS_ENV). This catches the rest, whoever wrote the
file: a rank given an environment of its own, a report written some other way. After the session,
the session's base temporary directory (every test's `tmp_path` and `tmp_path_factory.mktemp`;
under pytest-xdist the controller walks every worker's) is walked once, and each file that
- ends in `.json`, is a regular file of at most SIZE_LIMIT bytes and holds `"ddp-doctor.report"`,
- parses as a JSON object whose `schema` is "ddp-doctor.report",
is validated by the package's own validator, and its root cause must carry its cause_class and
action (a user's exception: code / fix_code); one that breaks either fails the session (exit
status 1, a section of pytest's summary with the path and what is wrong). Each evidence file there
(X.evidence.json, beside a training report) is judged again as `ddp-doctor analyze` judges it: a
verdict other than the one it recorded fails the session too, so every scenario a test launches
checks that its evidence replays to its verdict. Inputs that are not
JSON, or not a report, are left alone: a corrupt file given to `analyze` or `diff` on purpose
does not parse or names no schema. A test that writes a report that breaks the schema on
purpose is marked `@pytest.mark.invalid_reports_expected`: the temporary directories made while
it runs (its `tmp_path`, a module fixture's first `mktemp`) are listed in EXCLUDED_LIST at the
base directory and never walked.

The cost is one directory walk and a read of each `.json` file there: reports are small, and
only files that name the schema are parsed.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

SCHEMA_NAME = "ddp-doctor.report"
REPORT_MARK = b'"ddp-doctor.report"'
SIZE_LIMIT = 64 << 20  # bytes: a report of thousands of ranks is a few MB; a bigger file is a test's blob
EXCLUDED_LIST = "invalid-reports-expected.txt"  # at a base temporary directory: one excluded directory a line
ERRORS_SHOWN = 5  # per file
MARKER = "invalid_reports_expected"
_FOUND = pytest.StashKey[list]()
_REPLAYS = pytest.StashKey[list]()


def report_violations(root: str | os.PathLike[str]) -> list[tuple[str, list[str]]]:
    """(path, the ways it breaks the schema) for each report under `root` that breaks it, in path
    order; directories listed in an EXCLUDED_LIST file anywhere under `root` are left out."""
    from ddp_doctor.report.schema import validate_report
    excluded: list[str] = []
    found: list[tuple[str, list[str]]] = []
    for dirpath, dirnames, filenames in os.walk(root):  # symbolic links to directories are not followed
        dirnames.sort()
        if EXCLUDED_LIST in filenames:
            excluded += _listed(os.path.join(dirpath, EXCLUDED_LIST))
        for name in sorted(filenames):
            if name.endswith(".json"):
                report = _report_at(os.path.join(dirpath, name))
                if report is not None:
                    try:
                        errors = validate_report(report)
                    except RecursionError:
                        errors = ["$: nested too deeply to validate"]
                    errors += root_cause_kind_breaks(report)
                    if errors:
                        found.append((os.path.join(dirpath, name), errors[:ERRORS_SHOWN]))
    return [(path, errors) for path, errors in found
            if not any(path.startswith(d.rstrip(os.sep) + os.sep) for d in excluded)]


USER_EXCEPTION = "DDP800"  # a rank raised in the user's code: its kind is always code / fix_code


def root_cause_kind_breaks(report: dict[str, Any]) -> list[str]:
    """How a report's root cause lacks what an orchestrator acts on: its cause_class and action
    (every root cause this version writes has them), and a user's exception classed as code."""
    cause = report.get("root_cause")
    findings = report.get("findings")
    if not isinstance(cause, dict) or not any(isinstance(f, dict) and "cause_class" in f for f in findings or []):
        return []  # a report a test wrote by hand, in the form before the kinds
    kind = (cause.get("cause_class"), cause.get("action"))
    if None in kind:
        return [f"$.root_cause: {cause.get('id')} without cause_class and action"]
    if cause.get("id") == USER_EXCEPTION and kind != ("code", "fix_code"):
        return [f"$.root_cause: {USER_EXCEPTION} classed {kind}, not ('code', 'fix_code')"]
    return []


def evidence_mismatches(root: str | os.PathLike[str]) -> list[tuple[str, list[str]]]:
    """(path, how its replay differs) for each evidence file under `root` (X.evidence.json, written
    beside a training report) whose verdict, judged again as `ddp-doctor analyze X.evidence.json`
    judges it, is not the verdict it recorded: status, exit code, root cause, each finding's ID,
    severity and ranks. Directories listed in an EXCLUDED_LIST file are left out."""
    from ddp_doctor.training import evidence_file
    from ddp_doctor.training.job_report import replay
    excluded: list[str] = []
    found: list[tuple[str, list[str]]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if EXCLUDED_LIST in filenames:
            excluded += _listed(os.path.join(dirpath, EXCLUDED_LIST))
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if not name.endswith(".evidence.json") or not evidence_file.is_evidence_file(path):
                continue
            try:
                doc = evidence_file.read(path)
                judged = replay(doc)
            except Exception as e:  # noqa: BLE001 - a file the replay cannot read is a finding here
                found.append((path, [f"cannot be judged again: {type(e).__name__}: {e}"]))
                continue
            was, now = doc.get("verdict") or {}, evidence_file.verdict(judged.report, judged.code)
            diffs = [f"{k}: recorded {was.get(k)!r}, replayed {now.get(k)!r}" for k in now if was.get(k) != now[k]]
            if diffs:
                found.append((path, diffs[:ERRORS_SHOWN]))
    return [(path, errors) for path, errors in found
            if not any(path.startswith(d.rstrip(os.sep) + os.sep) for d in excluded)]


def _listed(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
    except OSError:
        return []


def _report_at(path: str) -> dict[str, Any] | None:
    """The report in the file at `path`; None when it is no report (not a plain file, too big, not
    JSON, not an object naming the report's schema)."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > SIZE_LIMIT:
            return None  # a pipe or a device would block the read; a link may lead out of the tree
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if REPORT_MARK not in data:
        return None
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) and parsed.get("schema") == SCHEMA_NAME else None


def _basetemp(config: pytest.Config) -> Path | None:
    factory = getattr(config, "_tmp_path_factory", None)  # what the tmp_path_factory fixture returns
    return None if factory is None else Path(factory.getbasetemp())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: the test writes reports that break the schema on purpose; "
                                       "neither the check at each write nor the walk after the session "
                                       "fails it for them")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """For a test marked invalid_reports_expected: the temporary directories made while it runs are
    listed as excluded."""
    base = _basetemp(item.config) if item.get_closest_marker(MARKER) else None
    before = set(os.listdir(base)) if base is not None else set()
    yield
    if base is None:
        return
    made = sorted(set(os.listdir(base)) - before - {EXCLUDED_LIST})
    if made:
        with open(base / EXCLUDED_LIST, "a", encoding="utf-8") as f:
            f.writelines(f"{base / name}\n" for name in made)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller walks every worker's directory
        return
    base = _basetemp(config)
    found = report_violations(base) if base is not None else []
    config.stash[_FOUND] = found
    replays = evidence_mismatches(base) if base is not None else []
    config.stash[_REPLAYS] = replays
    if not found and not replays:
        return
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if config.pluginmanager.get_plugin("terminalreporter") is None:  # no summary to say it in
        sys.stderr.write("\n".join((_lines(found) if found else []) + (_replay_lines(replays) if replays else []))
                         + "\n")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    replays = config.stash.get(_REPLAYS, [])
    if replays:
        terminalreporter.section("evidence files whose verdict a replay does not reproduce", red=True, bold=True)
        for line in _replay_lines(replays):
            terminalreporter.line(line, red=True)
    found = config.stash.get(_FOUND, [])
    if found:
        terminalreporter.section("reports that break the report schema", red=True, bold=True)
        for line in _lines(found):
            terminalreporter.line(line, red=True)


def _replay_lines(found: list[tuple[str, list[str]]]) -> list[str]:
    out = [f"{len(found)} evidence file(s) written during the session are judged differently by "
           "`ddp-doctor analyze FILE.evidence.json` than when they were written:"]
    for path, diffs in found:
        out.append(f"{path}:")
        out += [f"    {d}" for d in diffs]
    return out


def _lines(found: list[tuple[str, list[str]]]) -> list[str]:
    out = [f"{len(found)} ddp-doctor report(s) written during the session break the report schema "
           "(ddp_doctor/report/schema.json, docs/report-schema.md); a test that writes one on purpose is marked "
           f"@pytest.mark.{MARKER}:"]
    for path, errors in found:
        out.append(f"{path}:")
        out += [f"    {e}" for e in errors]
    return out
