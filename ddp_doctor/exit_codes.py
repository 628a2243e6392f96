"""The exit codes of every ddp-doctor command, defined once (the README's exit codes).

    EXIT_OK        0    no errors found (warnings do not count)
    EXIT_INTERNAL  1    ddp-doctor itself failed (a bug, a missing dependency, an unreadable state)
    EXIT_USAGE     2    usage error: a bad option or value, as argparse reports it
    EXIT_FAILED    3    preflight (or sagemaker-check) found errors; for `run`: training was not started
    EXIT_HANG    124    `run`: the training hung and was stopped (as timeout(1) reports a timeout)

Otherwise `ddp-doctor run` exits with the training's own exit code. A stop signal N (SIGTERM,
SIGINT, SIGHUP) to `run`, a self-launched preflight or `analyze` ends it with 128 + N after the
report is written (status "interrupted"); a closed output pipe with 141 (128 + SIGPIPE), as the
shell would.

`--fail-on error|warning` (or DDP_DOCTOR_FAIL_ON) on `run` and `preflight`: an exit status of 0
becomes EXIT_FAILED when the final report holds a finding of that severity or worse (fail_on_exit,
the one rule every command applies); any other status is kept.

`--exit-by-action` (or DDP_DOCTOR_EXIT_BY_ACTION=1) on `run` and `preflight`, for an orchestrator
that acts on exit codes (a Kubernetes pod failure policy, a SLURM requeue script): a failing
status becomes the code of the root cause's action (action_exit, the sysexits.h numbers):

    EXIT_FIX_CODE           70  the code is wrong (EX_SOFTWARE): a retry fails the same way
    EXIT_FIX_CONFIGURATION  78  the configuration is wrong (EX_CONFIG): a retry fails the same way
    EXIT_RETRY              75  a transient fault (EX_TEMPFAIL): run the job again
    EXIT_EXCLUDE_HOST       69  a bad host (EX_UNAVAILABLE): run again without it (root_cause.hosts)

A root cause to investigate, a stop signal's 128 + N and a status of 0 are kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_FAILED = 3
EXIT_HANG = 124
EXIT_FIX_CODE, EXIT_FIX_CONFIGURATION, EXIT_RETRY, EXIT_EXCLUDE_HOST = 70, 78, 75, 69
EXIT_OF_ACTION = {"fix_code": EXIT_FIX_CODE, "fix_configuration": EXIT_FIX_CONFIGURATION, "retry": EXIT_RETRY,
                  "exclude_host": EXIT_EXCLUDE_HOST}
EXIT_BY_ACTION_ENV = "DDP_DOCTOR_EXIT_BY_ACTION"
EXIT_BY_ACTION_HELP = ("on a FAIL verdict, exit with the code of the root cause's action: 70 fix the code, 78 fix "
                       "the configuration, 75 retry, 69 exclude the host (default: $DDP_DOCTOR_EXIT_BY_ACTION)")


FAIL_ON_ENV = "DDP_DOCTOR_FAIL_ON"
FAIL_ON_LEVELS = ("error", "warning")  # the severities --fail-on takes, most severe first
FAIL_ON_IDS_SHOWN = 10  # finding IDs named in the line that says why the exit status changed


@dataclass(frozen=True)
class FailOn:
    """--fail-on's setting: the least severe finding that fails the command (`level`) and where the
    setting came from (`source`, as the user wrote it: "--fail-on warning", "DDP_DOCTOR_FAIL_ON=error")."""

    level: str
    source: str


def fail_on_setting(given: str | None, env: Mapping[str, str]) -> FailOn | None:
    """The command line's --fail-on, else DDP_DOCTOR_FAIL_ON (empty or unset: not set); None when
    neither asks. ValueError, one line naming where the bad value came from, for any other value."""
    if given is not None:
        value, source = given, f"--fail-on {given}"
    else:
        value = env.get(FAIL_ON_ENV, "").strip()
        if not value:
            return None
        source = f"{FAIL_ON_ENV}={value}"
    if value not in FAIL_ON_LEVELS:
        where = f"--fail-on {value!r}" if given is not None else f"{FAIL_ON_ENV}={value!r}"
        raise ValueError(f"{where} is not {' or '.join(FAIL_ON_LEVELS)}, the severity from which the exit "
                         f"status is {EXIT_FAILED}" + ("" if given is not None else "; set one of them, or unset it"))
    return FailOn(value, source)


FAIL_LEFT_AT_0 = (f"ddp-doctor: exit {EXIT_OK}, the training's own status, though the verdict is FAIL; to make CI "
                  f"fail on it, add --fail-on error (or set DDP_DOCTOR_FAIL_ON=error): exit {EXIT_FAILED} then")


def fail_on_exit(code: int, report: Mapping[str, Any], fail_on: FailOn | None) -> tuple[int, str | None]:
    """The exit status once --fail-on is applied, and the line that says why it changed (None when
    it did not). Only a status of 0 changes (a failing training, a hang, a stop keep their own),
    to EXIT_FAILED when the report holds a finding of `fail_on.level` or worse. A report that holds
    only the verdict (a rank of a preflight that did not write the report) is judged by its status,
    silently: the reporting rank says why. A FAIL verdict of a training that exited 0, with no
    --fail-on asked, keeps 0 and gets the line that says so and how to fail CI on it."""
    if fail_on is None and code == EXIT_OK and report.get("status") == "fail":
        return code, FAIL_LEFT_AT_0
    if fail_on is None or code != EXIT_OK:
        return code, None
    worse = FAIL_ON_LEVELS[:FAIL_ON_LEVELS.index(fail_on.level) + 1]
    found: dict[str, str] = {}
    for f in report.get("findings") or []:
        if f.get("severity") in worse and f.get("id"):
            found.setdefault(str(f["id"]), str(f["severity"]))
    if not found:
        statuses = {"error": ("fail",), "warning": ("fail", "warn")}[fail_on.level]
        return (EXIT_FAILED, None) if not report.get("findings") and report.get("status") in statuses else (code, None)
    named = sorted(found.items(), key=lambda kv: (worse.index(kv[1]), kv[0]))
    shown = ", ".join(f"{i} ({sev})" for i, sev in named[:FAIL_ON_IDS_SHOWN])
    more = f" and {len(named) - FAIL_ON_IDS_SHOWN} more" if len(named) > FAIL_ON_IDS_SHOWN else ""
    return EXIT_FAILED, (f"ddp-doctor: exit {EXIT_FAILED} instead of {code}, as {fail_on.source} asks: "
                         f"the report holds {shown}{more}")


def exit_by_action(env: Mapping[str, str]) -> bool:
    """Whether DDP_DOCTOR_EXIT_BY_ACTION asks for the action's exit codes (`--exit-by-action` sets it,
    so that every rank sees it): any value but empty, 0, false, no, off."""
    return env.get(EXIT_BY_ACTION_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def action_exit(code: int, report: Mapping[str, Any], asked: bool) -> tuple[int, str | None]:
    """The exit status once --exit-by-action is applied (`asked`), and the line that says why it
    changed (None when it did not): a failing status (not 0, not a stop's 128 + N) of a report
    whose root cause has an action with a code (EXIT_OF_ACTION) becomes that code."""
    cause = report.get("root_cause") or {}
    action = str(cause.get("action") or "")
    if not asked or code == EXIT_OK or report.get("status") != "fail" or action not in EXIT_OF_ACTION:
        return code, None
    new = EXIT_OF_ACTION[action]
    if new == code:
        return code, None
    hosts = f" {', '.join(cause.get('hosts') or [])}" if action == "exclude_host" and cause.get("hosts") else ""
    return new, (f"ddp-doctor: exit {new} ({action}{hosts}) instead of {code}, as --exit-by-action "
                 f"({EXIT_BY_ACTION_ENV}) asks: root cause {cause.get('id')}, cause class {cause.get('cause_class')}")
