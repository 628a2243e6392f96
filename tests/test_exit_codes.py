"""--fail-on error|warning and DDP_DOCTOR_FAIL_ON: the one rule every command applies
(exit_codes.fail_on_exit, pure), where its setting comes from (fail_on_setting), the stderr line that
says why the exit status changed (report.publish.apply_fail_on), and the options of `run` and
`preflight` that read it. The commands on real processes: tests/training/test_probes_e2e.py (`run`)
and tests/cli/test_fail_on.py (`preflight`, usage errors)."""
from __future__ import annotations

import argparse

import pytest

from ddp_doctor.exit_codes import (
    EXIT_FAILED,
    EXIT_HANG,
    EXIT_OK,
    FAIL_LEFT_AT_0,
    FAIL_ON_ENV,
    FAIL_ON_IDS_SHOWN,
    FailOn,
    fail_on_exit,
    fail_on_setting,
)

ERROR = FailOn("error", "--fail-on error")
WARNING = FailOn("warning", f"{FAIL_ON_ENV}=warning")


def report(*findings: tuple[str, str], status: str | None = None) -> dict:
    sev = {s for _, s in findings}
    return {"status": status or ("fail" if "error" in sev else "warn" if "warning" in sev else "pass"),
            "findings": [{"id": i, "severity": s} for i, s in findings]}


# ------------------------------------------------------------------ where the setting comes from

def test_no_setting_anywhere_is_none() -> None:
    assert fail_on_setting(None, {}) is None
    assert fail_on_setting(None, {FAIL_ON_ENV: ""}) is None and fail_on_setting(None, {FAIL_ON_ENV: "  "}) is None


def test_the_command_line_wins_over_the_environment() -> None:
    assert fail_on_setting("warning", {}) == FailOn("warning", "--fail-on warning")
    assert fail_on_setting(None, {FAIL_ON_ENV: "error"}) == FailOn("error", f"{FAIL_ON_ENV}=error")
    assert fail_on_setting("error", {FAIL_ON_ENV: "warning"}) == FailOn("error", "--fail-on error")
    assert fail_on_setting("error", {FAIL_ON_ENV: "bogus"}).level == "error"  # the variable is not read


@pytest.mark.parametrize("given,env,needle", [
    (None, {FAIL_ON_ENV: "warn"}, f"{FAIL_ON_ENV}='warn' is not error or warning"),
    (None, {FAIL_ON_ENV: "Error"}, f"{FAIL_ON_ENV}='Error' is not error or warning"),
    ("info", {}, "--fail-on 'info' is not error or warning"),
])
def test_a_bad_value_names_where_it_came_from(given, env, needle) -> None:
    with pytest.raises(ValueError) as e:
        fail_on_setting(given, env)
    assert needle in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------ the rule

def test_without_a_setting_the_exit_status_is_untouched_and_a_fail_left_at_0_is_said() -> None:
    failed = {**report(("DDP850", "error")), "status": "fail"}
    assert fail_on_exit(EXIT_OK, failed, None) == (EXIT_OK, FAIL_LEFT_AT_0)
    assert "--fail-on error" in FAIL_LEFT_AT_0 and "DDP_DOCTOR_FAIL_ON=error" in FAIL_LEFT_AT_0
    assert fail_on_exit(EXIT_OK, {**failed, "status": "warn"}, None) == (EXIT_OK, None)
    assert fail_on_exit(1, failed, None) == (1, None)  # the training's own failure: its status says it


def test_error_fails_on_an_error_only() -> None:
    code, line = fail_on_exit(EXIT_OK, report(("DDP850", "error"), ("DDP603", "warning")), ERROR)
    assert code == EXIT_FAILED
    assert line == ("ddp-doctor: exit 3 instead of 0, as --fail-on error asks: the report holds DDP850 (error)")
    assert fail_on_exit(EXIT_OK, report(("DDP603", "warning"), ("DDP104", "info")), ERROR) == (EXIT_OK, None)


def test_warning_fails_on_a_warning_or_an_error_never_on_info() -> None:
    code, line = fail_on_exit(EXIT_OK, report(("DDP603", "warning"), ("DDP104", "info")), WARNING)
    assert code == EXIT_FAILED and line is not None
    assert f"as {FAIL_ON_ENV}=warning asks" in line and "DDP603 (warning)" in line and "DDP104" not in line
    assert fail_on_exit(EXIT_OK, report(("DDP850", "error")), WARNING)[0] == EXIT_FAILED
    assert fail_on_exit(EXIT_OK, report(("DDP104", "info")), WARNING) == (EXIT_OK, None)
    assert fail_on_exit(EXIT_OK, report(), WARNING) == (EXIT_OK, None)


@pytest.mark.parametrize("code", [1, 2, EXIT_FAILED, 7, EXIT_HANG, 128 + 15, 141])
def test_a_non_zero_status_is_never_replaced(code: int) -> None:
    """A failing training, a hang, a stop, a failed preflight keep their own exit status."""
    assert fail_on_exit(code, report(("DDP850", "error"), ("DDP603", "warning")), WARNING) == (code, None)


def test_each_id_is_named_once_most_severe_first_and_the_list_is_bounded() -> None:
    rep = report(("DDP603", "warning"), ("DDP850", "error"), ("DDP603", "warning"), ("DDP400", "warning"))
    _, line = fail_on_exit(EXIT_OK, rep, WARNING)
    assert line is not None and line.endswith("the report holds DDP850 (error), DDP400 (warning), DDP603 (warning)")
    many = report(*[(f"DDP{700 + i}", "warning") for i in range(FAIL_ON_IDS_SHOWN + 3)])
    _, line = fail_on_exit(EXIT_OK, many, WARNING)
    assert line is not None and line.endswith(" and 3 more") and line.count("(warning)") == FAIL_ON_IDS_SHOWN


@pytest.mark.parametrize("status,level,expected", [
    ("fail", "error", EXIT_FAILED), ("warn", "error", EXIT_OK), ("warn", "warning", EXIT_FAILED),
    ("fail", "warning", EXIT_FAILED), ("pass", "warning", EXIT_OK), ("running", "warning", EXIT_OK),
])
def test_a_verdict_without_findings_is_judged_by_its_status_silently(status, level, expected) -> None:
    """A preflight rank under a launcher that did not write the report holds the verdict only
    (status, root cause): it exits as the reporting rank does, and that rank says why."""
    assert fail_on_exit(EXIT_OK, {"status": status, "findings": []}, FailOn(level, "x")) == (expected, None)


# ------------------------------------------------------------------ the line, and the options

def test_apply_fail_on_says_it_once_on_stderr_only_when_it_changed(capsys) -> None:
    from ddp_doctor.report.publish import apply_fail_on
    assert apply_fail_on(EXIT_OK, report(("DDP850", "error")), ERROR) == EXIT_FAILED
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        "ddp-doctor: exit 3 instead of 0, as --fail-on error asks: the report holds DDP850 (error)"]
    assert apply_fail_on(1, report(("DDP850", "error")), ERROR) == 1
    assert apply_fail_on(EXIT_OK, report(("DDP603", "warning")), ERROR) == EXIT_OK
    assert capsys.readouterr() == ("", "")
    assert apply_fail_on(EXIT_OK, report(("DDP850", "error")), None) == EXIT_OK  # FAIL, nothing asked: said
    assert capsys.readouterr() == ("", FAIL_LEFT_AT_0 + "\n")


def test_preflight_reads_the_option_then_the_variable() -> None:
    from ddp_doctor.cli.options import UsageError
    from ddp_doctor.cli.preflight import fail_on_option
    assert fail_on_option(argparse.Namespace(fail_on="warning"), {}) == FailOn("warning", "--fail-on warning")
    assert fail_on_option(argparse.Namespace(fail_on=None), {FAIL_ON_ENV: "error"}).level == "error"
    assert fail_on_option(argparse.Namespace(fail_on=None), {}) is None
    with pytest.raises(UsageError, match=f"{FAIL_ON_ENV}='on'"):
        fail_on_option(argparse.Namespace(fail_on=None), {FAIL_ON_ENV: "on"})


def test_run_reads_the_option_then_the_variable(monkeypatch) -> None:
    from ddp_doctor.cli.run_argv import RunUsageError, run_options, split_argv
    monkeypatch.delenv(FAIL_ON_ENV, raising=False)
    _, doctor, target = split_argv(["--nproc-per-node", "2", "--fail-on", "warning", "train.py", "--fail-on", "x"])
    assert doctor == ["--fail-on", "warning"] and target.args == ["--fail-on", "x"]  # the script's own stay its own
    assert run_options(doctor, target).fail_on == FailOn("warning", "--fail-on warning")
    assert run_options([], target).fail_on is None
    monkeypatch.setenv(FAIL_ON_ENV, "error")
    assert run_options([], target).fail_on == FailOn("error", f"{FAIL_ON_ENV}=error")
    assert run_options(["--fail-on=warning"], target).fail_on.level == "warning"
    monkeypatch.setenv(FAIL_ON_ENV, "1")
    with pytest.raises(RunUsageError, match=f"{FAIL_ON_ENV}='1' is not error or warning"):
        run_options([], target)
    with pytest.raises(RunUsageError, match="argument --fail-on: invalid choice: 'warnings'"):
        run_options(["--fail-on", "warnings"], target)


def test_under_an_outside_launcher_a_peers_fail_on_exit_is_not_a_stop_of_the_job(tmp_path) -> None:
    """torchrun stops the other ranks when the rank that wrote the verdict exits 3 by --fail-on: a rank
    whose script ended well lets the verdict stand (no "interrupted" report); any other stop is one."""
    from types import SimpleNamespace

    from ddp_doctor.training import records
    from ddp_doctor.training.run.stopped_rank import stopped_for_fail_on
    watch = SimpleNamespace(run_dir=str(tmp_path), rank=0, job_since=0.0)
    assert not stopped_for_fail_on(watch)  # nothing ended yet: a stop of the job
    records.write_outcome(str(tmp_path), 0, {"exit_code": 0, "exception": None})
    records.write_outcome(str(tmp_path), 1, {"exit_code": 0, "exception": None})
    assert not stopped_for_fail_on(watch)  # no peer exited by --fail-on
    records.write_outcome(str(tmp_path), 1, {"exit_code": 0, "exception": None, "fail_on": "error"})
    assert stopped_for_fail_on(watch)
    records.write_outcome(str(tmp_path), 0, {"exit_code": 2, "exception": None})
    assert not stopped_for_fail_on(watch)  # this rank failed itself: its own ending is reported
