"""What kind of cause a finding is and what to do with the job (findings.CAUSE_CLASSES, ACTIONS):
declared with each ID (registry), carried by every finding and the root cause (report/build.py),
said in the verdict's "Next:" line (report/render.py), and, with --exit-by-action, the exit code an
orchestrator acts on (exit_codes.action_exit). The command on real processes: the last test."""
from __future__ import annotations

import subprocess

import pytest
from helpers.procs import DDP, NO_SWEEP, clean_env

from ddp_doctor import checks as catalogue
from ddp_doctor import registry
from ddp_doctor.exit_codes import (
    EXIT_BY_ACTION_ENV,
    EXIT_EXCLUDE_HOST,
    EXIT_FIX_CODE,
    EXIT_FIX_CONFIGURATION,
    EXIT_OF_ACTION,
    EXIT_RETRY,
    action_exit,
    exit_by_action,
)
from ddp_doctor.findings import ACTION_OF_CLASS, ACTIONS, CAUSE_CLASSES, CLASS_OF_CATEGORY, Finding, Problem
from ddp_doctor.report import build as reportlib
from ddp_doctor.report.render import render_text


def test_every_id_has_a_class_and_an_action_and_every_category_a_default():
    entries = catalogue.load_catalogue()
    assert set(CLASS_OF_CATEGORY) == set(registry.CATEGORIES)
    assert set(ACTION_OF_CLASS) == set(CAUSE_CLASSES) and set(ACTION_OF_CLASS.values()) <= set(ACTIONS)
    for e in entries.values():
        assert e.cause_class in CAUSE_CLASSES and e.action in ACTIONS, e.id
    assert set(EXIT_OF_ACTION) == set(ACTIONS) - {"investigate"}


@pytest.mark.parametrize("id, kind", [
    ("DDP800", ("code", "fix_code")),            # the user's exception
    ("DDP850", ("code", "fix_code")),            # ranks draw the same samples: the script's sampler
    ("DDP210", ("configuration", "fix_configuration")),
    ("DDP820", ("configuration", "fix_configuration")),
    ("DDP506", ("host", "exclude_host")),        # uncorrectable ECC errors
    ("DDP401", ("host", "exclude_host")),        # all_reduce gives a wrong result
    ("DDP313", ("network", "retry")),            # the port is taken: another port, or later
    ("DDP312", ("network", "investigate")),      # unreachable: a security group or a host that is down
    ("DDP803", ("unknown", "investigate")),      # ended without a Python error
])
def test_the_declared_kind_of_some_ids(id, kind):
    entry = catalogue.load_catalogue()[id]
    assert (entry.cause_class, entry.action) == kind


def test_a_problem_may_say_its_own_kind_where_the_evidence_decides():
    entry = catalogue.load_catalogue()["DDP803"]
    f = entry.finding(Problem("killed", cause_class="host"), rank=1)
    assert (f.cause_class, f.action) == ("host", "exclude_host")
    f = entry.finding(Problem("killed"), rank=1)
    assert (f.cause_class, f.action) == ("unknown", "investigate")


def test_a_finding_read_back_keeps_its_kind_and_an_old_one_gets_its_categorys():
    f = Finding(id="DDP506", category="gpu", severity="error", title="t", message="m", hint="h", ranks=[1],
                cause_class="host", action="exclude_host")
    assert Finding.from_dict(f.to_dict()).kind == ("host", "exclude_host")
    old = {k: v for k, v in f.to_dict().items() if k not in ("cause_class", "action")}
    assert Finding.from_dict(old).kind == ("host", "exclude_host")  # gpu: host
    assert Finding.from_dict({**old, "category": "sampler"}).kind == ("code", "fix_code")


def _report(cause: Finding) -> dict:
    ranks = [reportlib.rank_entry({"rank": r, "hostname": f"algo-{r + 1}"}) for r in range(2)]
    return reportlib.build_report(world={"launcher": "torchrun", "world_size": 2}, ranks=ranks, findings=[cause])


def _finding(kind: tuple[str, str], ranks=(1,)) -> Finding:
    return Finding(id="DDP506", category="gpu", severity="error", title="t", message="m", hint="h",
                   ranks=list(ranks), cause_class=kind[0], action=kind[1])


def test_the_root_cause_names_the_hosts_to_leave_out_and_the_verdict_says_what_to_do():
    rep = _report(_finding(("host", "exclude_host")))
    assert rep["root_cause"]["hosts"] == ["algo-2"]
    assert "  Next: run the job again without algo-2 (cause: the host)" in render_text(rep).splitlines()
    rep = _report(_finding(("code", "fix_code")))
    assert "hosts" not in rep["root_cause"]
    assert "  Next: fix the code (cause: code); running the job again fails the same way" in render_text(rep)


@pytest.mark.parametrize("kind, code", [
    (("code", "fix_code"), EXIT_FIX_CODE), (("configuration", "fix_configuration"), EXIT_FIX_CONFIGURATION),
    (("network", "retry"), EXIT_RETRY), (("host", "exclude_host"), EXIT_EXCLUDE_HOST),
])
def test_exit_by_action_gives_each_action_its_code(kind, code):
    rep = _report(_finding(kind))
    new, line = action_exit(1, rep, True)
    assert new == code and line is not None and f"exit {code} ({kind[1]}" in line and "instead of 1" in line
    assert action_exit(1, rep, False) == (1, None)  # not asked: the job's own status


def test_exit_by_action_keeps_a_pass_a_stop_and_what_must_be_looked_into():
    assert action_exit(0, _report(_finding(("code", "fix_code"))), True)[0] == 0  # a training that exited 0
    stopped = {**_report(_finding(("code", "fix_code"))), "status": "interrupted"}
    assert action_exit(143, stopped, True) == (143, None)
    assert action_exit(1, _report(_finding(("unknown", "investigate"))), True) == (1, None)


@pytest.mark.parametrize("value, asked", [("1", True), ("yes", True), ("", False), ("0", False), ("off", False)])
def test_the_variable(value, asked):
    assert exit_by_action({EXIT_BY_ACTION_ENV: value}) is asked
    assert exit_by_action({}) is False


@pytest.mark.slow
def test_run_exits_with_the_actions_code_for_a_users_exception(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\n"
                      "if dist.get_rank() == 1:\n"
                      "    raise ValueError('bad value on rank 1')\n"
                      "dist.barrier()\n")
    report = tmp_path / "r.json"
    res = subprocess.run([*DDP, "run", "--nproc-per-node", "2", *NO_SWEEP, "--exit-by-action", "--report",
                          str(report), str(script)], env=clean_env(), cwd=tmp_path, capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == EXIT_FIX_CODE, res.stderr[-3000:]
    import json
    cause = json.loads(report.read_text())["root_cause"]
    assert (cause["id"], cause["ranks"], cause["cause_class"], cause["action"]) == ("DDP800", [1], "code", "fix_code")
    assert "Next: fix the code" in res.stderr
    assert f"exit {EXIT_FIX_CODE} (fix_code) instead of 1, as --exit-by-action" in res.stderr


def test_the_one_paragraph_diagnosis_says_the_action_first():
    from ddp_doctor.report.sinks import diagnosis_text
    rep = _report(_finding(("host", "exclude_host")))
    assert diagnosis_text(rep).startswith("ddp-doctor: fail (action: exclude_host algo-2): [DDP506] t on rank 1")
    assert diagnosis_text(_report(_finding(("code", "fix_code"))), 40).startswith("ddp-doctor: fail (action: fix_code)")
