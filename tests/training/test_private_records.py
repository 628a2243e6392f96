"""Run directories are private (0700) and so is every record in them (0600); the records are
redacted before they are written. In-process: the e2e runs are in
test_run_dir_private_e2e.py."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ddp_doctor.report import private_files
from ddp_doctor.report.private_files import make_private_dir, open_private, write_private
from ddp_doctor.training import records

HF = "hf_abcdefghijklmnopqrstuvwxyz0123456"


def mode(p: Path | str) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_a_new_run_directory_is_0700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        assert make_private_dir(str(tmp_path / "a" / "run"))
    finally:
        os.umask(old)
    assert mode(tmp_path / "a" / "run") == 0o700


def test_an_earlier_versions_run_directory_is_tightened_with_what_it_holds(tmp_path: Path) -> None:
    run = tmp_path / "ddp-doctor-run-job"
    (run / "preflight").mkdir(parents=True)
    (run / "rank-1.json").write_text("{}")
    (run / "preflight" / "rank-0.json").write_text("{}")
    for p, m in ((run, 0o755), (run / "preflight", 0o755), (run / "rank-1.json", 0o644),
                 (run / "preflight" / "rank-0.json", 0o644)):
        os.chmod(p, m)
    assert make_private_dir(str(run))
    assert mode(run) == mode(run / "preflight") == 0o700
    assert mode(run / "rank-1.json") == mode(run / "preflight" / "rank-0.json") == 0o600


def test_a_run_directory_of_another_user_is_left_alone_with_a_warning(tmp_path: Path, monkeypatch, capsys) -> None:
    run = tmp_path / "theirs"
    run.mkdir()
    os.chmod(run, 0o755)
    monkeypatch.setattr(private_files.os, "geteuid", lambda: os.stat(run).st_uid + 1)
    assert not make_private_dir(str(run))
    assert mode(run) == 0o755
    err = capsys.readouterr().err
    assert "ddp-doctor: warning:" in err and "belongs to another user" in err and str(run) in err


def test_tighten_tree_covers_what_torch_and_nccl_wrote_with_the_umask(tmp_path: Path) -> None:
    dump = tmp_path / "nccl-fr-rank-0"
    dump.write_bytes(b"pickled")
    os.chmod(dump, 0o644)
    # torch's launcher's log tree, made with the umask: all of it; a directory not made for the run: not entered
    deep = tmp_path / "elastic" / "none_abc" / "attempt_0" / "1"
    deep.mkdir(parents=True)
    (deep / "error.json").write_text("{}")
    other = tmp_path / "users_own"
    other.mkdir()
    (other / "x").write_text("x")
    for p in (deep / "error.json", other / "x"):
        os.chmod(p, 0o644)
    for p in (tmp_path / "elastic", deep.parent.parent, deep.parent, deep, other):
        os.chmod(p, 0o755)
    private_files.tighten_tree(str(tmp_path))
    assert mode(dump) == 0o600
    assert [mode(p) for p in (tmp_path / "elastic", deep.parent.parent, deep.parent, deep)] == [0o700] * 4
    assert mode(deep / "error.json") == 0o600
    assert (mode(other), mode(other / "x")) == (0o755, 0o644)


def test_open_private_creates_0600_and_tightens_an_existing_file(tmp_path: Path) -> None:
    old = tmp_path / "crash-0.txt"
    old.write_text("an earlier run's stack")
    os.chmod(old, 0o644)
    with open_private(str(old)) as f:
        f.write("new")
    assert mode(old) == 0o600 and old.read_text() == "new"
    with open_private(str(tmp_path / "stack-1.txt")) as f:
        f.write("x")
    assert mode(tmp_path / "stack-1.txt") == 0o600


def test_open_private_never_follows_a_link(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / "stack-0.txt").symlink_to(target)
    with pytest.raises(OSError):
        open_private(str(tmp_path / "stack-0.txt"))
    assert target.read_text() == "keep"


def test_write_private_replaces_atomically_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.json"
    path.write_text("old")
    os.chmod(path, 0o644)
    write_private(str(path), "new")
    assert path.read_text() == "new" and mode(path) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["agent.json"]


def test_every_record_writer_makes_0600_files(tmp_path: Path) -> None:
    run = str(tmp_path)
    records.write_outcome(run, 1, {"exit_code": 1})
    records.write_heartbeat(run, 1, {"phase": "training"})
    records.write_ledger(run, 1, {"entries": []})
    records.write_json(records.probe_path(run, 123), {"pid": 123})
    records.write_json(records.init_call_path(run, 123), {"pid": 123})
    records.write_json(records.ledger_request_path(run), {"reason": "hang"})
    for name in os.listdir(run):
        assert mode(os.path.join(run, name)) == 0o600, name


def test_outcome_records_are_redacted_before_they_are_written(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MY_DB_PASSWORD", "correct horse battery")
    message = f"login failed for password=hunter2 token {HF} (pw correct horse battery)"
    records.write_outcome(str(tmp_path), 1, {"exit_code": 1, "exception": {
        "type": "RuntimeError", "message": message,
        "traceback": f"Traceback (most recent call last):\n  ...\nRuntimeError: {message}\n"}})
    text = Path(records.outcome_path(str(tmp_path), 1)).read_text()
    for secret in ("hunter2", HF, "correct horse battery"):
        assert secret not in text, secret
    back = records.read_outcomes(str(tmp_path))[1]
    assert back["exception"]["type"] == "RuntimeError" and back["exit_code"] == 1
    assert back["exception"]["message"].startswith("login failed for password=***")


def test_a_record_that_cannot_be_written_does_not_raise(tmp_path: Path) -> None:
    records.write_json(str(tmp_path / "missing" / "rank-0.json"), {"rank": 0})
    assert not (tmp_path / "missing").exists()


def test_heartbeats_and_ledgers_are_written_as_given(tmp_path: Path) -> None:
    """No free text in them, written every second or large: not run through the redaction."""
    records.write_heartbeat(str(tmp_path), 0, {"phase": "training", "where": "train.py:12 step"})
    hb = json.loads(Path(records.heartbeat_path(str(tmp_path), 0)).read_text())
    assert hb["where"] == "train.py:12 step"
