"""Suite-wide: every report ddp-doctor writes during a test is validated against the report's JSON
Schema (ddp_doctor/report/schema.json), in whatever process writes it.

ddp_doctor.report.sinks.write_report_file validates a report as it writes it when
TEST_ERRORS_ENV names a directory (set here, for this process and every child that inherits the
environment: ranks, launchers, `ddp-doctor run`), and leaves a file there for a report that breaks
the schema. After each test, a file there fails the test (an error at teardown) with the report's
path and what is wrong. Validation is the package's own (no jsonschema import in every rank), a
millisecond a report.

After the session, every report left in the session's temporary directories is validated too,
whoever wrote it (tests/helpers/report_files.py): a report that breaks the schema fails the run.

The fixture `launches` is the session's catalogue of launches several modules read (tests/helpers/launches.py).
How the modules are spread over xdist's workers: tests/helpers/schedule.py.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from typing import Iterator

import pytest
from helpers import schedule
from helpers.launches import launches  # noqa: F401 - the session's shared launches, a fixture of every module
from helpers.report_files import (  # noqa: F401 - the walk after the session (hooks, registered as this conftest's)
    MARKER,
    pytest_configure,
    pytest_runtest_protocol,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

from ddp_doctor.report.schema import TEST_ERRORS_ENV

# pytest keeps each test module, and each of the package's modules imported from here on, as it
# rewrote them for assert introspection (__pycache__/*-pytest-*.pyc) only where bytecode may be
# written: with PYTHONDONTWRITEBYTECODE set (as on this project's machines) every session and each
# xdist worker would rewrite them all again (about 9 s of CPU). This process only: the processes the
# tests start keep the environment's setting.
sys.dont_write_bytecode = False

_ERRORS_DIR = tempfile.mkdtemp(prefix="ddp-doctor-schema-errors-")
os.environ[TEST_ERRORS_ENV] = _ERRORS_DIR
os.environ.setdefault("DDP_DOCTOR_HISTORY", "off")  # no test writes the user's history unless it names one


def schema_errors() -> list[dict]:
    """The invalid reports recorded so far (and forget them)."""
    found = []
    for name in sorted(os.listdir(_ERRORS_DIR)):
        path = os.path.join(_ERRORS_DIR, name)
        try:
            with open(path, encoding="utf-8") as f:
                found.append(json.load(f))
        except (OSError, ValueError) as e:
            found.append({"path": path, "errors": [f"unreadable record: {e}"]})
        try:
            os.unlink(path)
        except OSError:
            pass
    return found


@pytest.fixture(autouse=True)
def _reports_follow_the_schema(request: pytest.FixtureRequest) -> Iterator[None]:
    schema_errors()  # a child of an earlier test that wrote late is not this test's
    yield
    if request.node.get_closest_marker(MARKER):
        return
    bad = schema_errors()
    if bad:
        lines = [f"{b.get('path')}:\n    " + "\n    ".join(b.get("errors") or []) for b in bad]
        pytest.fail("a report written during this test breaks the report schema "
                    "(ddp_doctor/report/schema.json, docs/report-schema.md):\n" + "\n".join(lines), pytrace=False)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_ERRORS_DIR, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before xdist's worker adds the group to each test's id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    schedule.mark_groups(items)
