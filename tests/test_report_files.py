"""The suite's last check (tests/helpers/report_files.py): after the session, every ddp-doctor report
left in the session's temporary directories must follow the report's schema. The walk names each
one that breaks it and nothing else; a session that leaves one fails, naming the file and what is
wrong, unless the test that wrote it is marked invalid_reports_expected.

Both tests here leave a broken report in their own directory, on purpose: they are marked.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from helpers.procs import clean_env, run
from helpers.report_files import EXCLUDED_LIST, SIZE_LIMIT, report_violations

from ddp_doctor.report.build import build_report
from ddp_doctor.report.sinks import report_json

ROOT = Path(__file__).resolve().parents[1]
GOOD = build_report(world={"launcher": "torchrun"}, ranks=[], findings=[])
STATUS_OK = '$.status: "ok" is not one of ["pass", "warn", "fail", "interrupted", "running"]'


@pytest.mark.invalid_reports_expected
def test_the_walk_names_each_report_that_breaks_the_schema_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "good.json").write_text(report_json(GOOD) + "\n")
    (tmp_path / "sub").mkdir()
    bad = tmp_path / "sub" / "r.json.rank1.json"
    bad.write_text(json.dumps({**GOOD, "status": "ok"}))  # whoever wrote it, whatever its layout
    (tmp_path / "sub" / "cut.json").write_text(report_json(GOOD)[:80])  # not JSON: an input, not judged
    (tmp_path / "sub" / "diff.json").write_text(json.dumps({"schema": "ddp-doctor.diff", "of": "ddp-doctor.report"}))
    (tmp_path / "sub" / "list.json").write_text('["ddp-doctor.report"]')
    (tmp_path / "sub" / "report.txt").write_text(json.dumps({**GOOD, "status": "ok"}))  # not .json
    os.mkfifo(tmp_path / "sub" / "pipe.json")  # never opened: a read would wait for a writer
    os.symlink(bad, tmp_path / "link.json")  # the file it leads to is judged where it is
    with open(tmp_path / "big.json", "wb") as f:  # sparse: past the size bound, never read
        f.truncate(SIZE_LIMIT + 1)
    (tmp_path / "excluded").mkdir()
    (tmp_path / "excluded" / "r.json").write_text(json.dumps({**GOOD, "status": "ok"}))
    (tmp_path / EXCLUDED_LIST).write_text(f"{tmp_path / 'excluded'}\n")
    assert report_violations(tmp_path) == [(str(bad), [STATUS_OK])]
    (tmp_path / "sub" / "deep.json").write_text('{"schema": "ddp-doctor.report", "world": ' + "[" * 100_000
                                                + "]" * 100_000 + "}")
    assert [p for p, _ in report_violations(tmp_path)] == [str(bad)]  # too deep to parse: not judged


INNER = '''
import json

import pytest

from ddp_doctor.report.build import build_report

BROKEN = {**build_report(world={"launcher": "torchrun"}, ranks=[], findings=[]), "status": "ok"}


def test_leaves_a_broken_report(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(BROKEN))


@pytest.mark.invalid_reports_expected
def test_leaves_one_on_purpose(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(BROKEN))


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return tmp_path_factory.mktemp("shared")


@pytest.mark.invalid_reports_expected
def test_leaves_one_on_purpose_in_a_module_directory(shared):
    (shared / "r.json").write_text(json.dumps(BROKEN))
'''


@pytest.mark.slow
@pytest.mark.invalid_reports_expected  # the inner sessions' directories are in this test's own
def test_a_session_that_leaves_a_broken_report_fails_naming_it_unless_its_test_is_marked(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")

    def session(name: str, *args: str):
        # the plugin alone: the installed ones (hypothesis, lightning, ddp-doctor's own) take seconds to import
        return run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "helpers.report_files",
                    f"--basetemp={tmp_path / name}", *args, "test_inner.py"],
                   clean_env(PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
                             PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"), str(tmp_path), 120)

    failed = session("all")
    assert failed.rc == 1, failed.output
    assert "3 passed" in failed.stdout and "reports that break the report schema" in failed.stdout, failed.output
    assert f"{tmp_path / 'all' / 'test_leaves_a_broken_report0' / 'r.json'}:\n    {STATUS_OK}" in failed.stdout
    assert "on_purpose" not in failed.stdout and "shared" not in failed.stdout, failed.output
    marked = session("marked", "-k", "on_purpose")
    assert marked.rc == 0 and "2 passed" in marked.stdout and "break the report schema" not in marked.stdout, \
        marked.output
