"""ddp-doctor's own records degrade, never the job: a run directory without
room or that cannot be made moves the records elsewhere with a warning; one removed while the
job runs is made again (and the watchdog's stack file with it); a record that cannot be written
says so once; ddp-doctor's text tolerates closed and broken streams, and a process started with
stdio closed puts /dev/null there for itself and its children. The e2e runs are in
test_degraded_records_e2e.py."""
from __future__ import annotations

import errno
import io
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers.procs import wait_for

from ddp_doctor.report import private_files, publish
from ddp_doctor.report.private_files import keep_dir, let_go, make_records_dir, records_problem, write_private
from ddp_doctor.training import records


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Fallback places inside the test's directory (not /dev/shm)."""
    places = [tmp_path / "shm", tmp_path / "vartmp"]
    for p in places:
        p.mkdir()
    monkeypatch.setattr(private_files, "FALLBACK_ROOTS", tuple(map(str, places)))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # as TMPDIR would
    return places


def test_a_usable_place_is_used_without_a_word(tmp_path: Path, roots: list[Path]) -> None:
    d, note = make_records_dir(parent=str(tmp_path / "keep"))
    assert note is None and Path(d).parent == tmp_path / "keep" and Path(d).name.startswith("ddp-doctor-run-")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert records_problem(d) is None and os.listdir(d) == []  # the probe file is gone


def test_a_fixed_directory_that_cannot_be_made_moves_under_the_same_name(tmp_path: Path, roots: list[Path]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    asked = str(blocker / "ddp-doctor-run-job7")  # under a regular file: cannot be made, even as root
    d, note = make_records_dir(asked)
    assert d == str(roots[0] / "ddp-doctor-run-job7")
    assert note and asked in note and "Not a directory" in note and d in note
    # every rank of the node computes the same place
    assert make_records_dir(asked)[0] == d


def test_a_users_run_dir_name_gets_a_name_no_other_path_has(tmp_path: Path, roots: list[Path]) -> None:
    (tmp_path / "f").write_text("")
    a, _ = make_records_dir(str(tmp_path / "f" / "run"))
    b, _ = make_records_dir(str(tmp_path / "f" / "other" / "run"))
    assert Path(a).parent == roots[0] and Path(a).name.startswith("ddp-doctor-run-") and a != b


def test_a_full_file_system_is_no_place_for_records(tmp_path: Path, roots: list[Path],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    real = private_files.records_problem
    full = str(tmp_path / "tmp")
    monkeypatch.setattr(private_files, "records_problem",
                        lambda p: "its file system is full: 12 KiB free" if p.startswith(full) else real(p))
    d, note = make_records_dir()  # TMPDIR full
    assert Path(d).parent == roots[0] and note and "12 KiB free" in note
    assert os.listdir(full) == []  # the directory made there and not used is removed


def test_with_no_room_anywhere_the_first_place_made_is_used_and_said(tmp_path: Path, roots: list[Path],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(private_files, "RECORDS_ROOM", 1 << 62)
    d, note = make_records_dir(parent=str(tmp_path / "keep"))
    assert Path(d).parent == tmp_path / "keep" and "may be incomplete" in (note or "")
    assert not any(os.listdir(p) for p in (*roots, tmp_path / "tmp"))  # tried, not used: removed


def test_with_no_place_at_all_the_asked_directory_is_returned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "f").write_text("")
    monkeypatch.setattr(private_files, "FALLBACK_ROOTS", (str(tmp_path / "f" / "x"),))
    d, note = make_records_dir(str(tmp_path / "f" / "run"))
    assert d == str(tmp_path / "f" / "run") and "are lost" in (note or "")


def test_records_problem_names_a_read_only_or_missing_place(tmp_path: Path) -> None:
    assert records_problem(str(tmp_path / "missing"))
    if os.geteuid() != 0:  # root writes through mode bits
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert "Permission denied" in (records_problem(str(ro)) or "")


def test_a_kept_directory_removed_under_the_writer_is_made_again(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "ddp-doctor-run-x"
    run.mkdir(mode=0o700)
    keep_dir(str(run))
    try:
        shutil.rmtree(run)
        write_private(str(run / "hb-0.json"), "{}")
        write_private(str(run / "hb-1.json"), "{}")
        assert (run / "hb-0.json").read_text() == "{}" and stat.S_IMODE(os.stat(run).st_mode) == 0o700
        assert capsys.readouterr().err.count("was removed while the job ran: made again") == 1
    finally:
        let_go(str(run))
    shutil.rmtree(run)
    with pytest.raises(FileNotFoundError):  # let go: its owner removed it, it stays removed
        write_private(str(run / "hb-0.json"), "{}")
    assert not run.exists()


def test_a_record_that_cannot_be_written_is_said_once_and_never_raises(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    def full(path: str, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", path)
    monkeypatch.setattr(records, "write_private", full)
    monkeypatch.setattr(records, "_lost_said", False)
    records.write_outcome(str(tmp_path), 0, {"exit_code": 0})
    records.write_heartbeat(str(tmp_path), 0, {"time": 1.0})
    err = capsys.readouterr().err
    assert err.count("ddp-doctor: warning: could not write") == 1 and "No space left" in err


def test_a_missing_directory_at_the_end_of_a_run_says_nothing(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "_lost_said", False)
    records.write_heartbeat(str(tmp_path / "gone"), 0, {"time": 1.0})
    assert capsys.readouterr().err == ""


def test_reports_and_warnings_survive_closed_and_broken_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    rep = {"status": "fail", "phase": "training", "findings": [], "world": {}, "ranks": []}
    closed = io.StringIO()
    closed.close()
    publish.show(rep, publish.Output(), None, stream=closed)
    r, w = os.pipe()
    os.close(r)
    broken = os.fdopen(w, "w")
    try:
        publish.show(rep, publish.Output(), None, stream=broken)  # EPIPE: the reader is gone
        monkeypatch.setattr(sys, "stderr", broken)
        publish.warn("still no traceback")
        monkeypatch.setattr(sys, "stderr", None)  # Python started with fd 2 closed
        publish.warn("nor here")
    finally:
        try:
            broken.close()
        except OSError:
            pass


CHILD = """
import os, subprocess, sys
from ddp_doctor.cli import reopen_closed_stdio
before = [sys.stdout is None, sys.stderr is None]
reopen_closed_stdio()
print("to /dev/null")  # no error: stdout exists now
kid = subprocess.run([sys.executable, "-c", "import os; os.fstat(1); os.fstat(2)"]).returncode
with open(sys.argv[1], "w") as f:
    f.write(repr((before, os.readlink("/proc/self/fd/1"), os.readlink("/proc/self/fd/2"), kid)))
"""


def test_a_process_started_with_stdout_and_stderr_closed_puts_dev_null_there(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    res = subprocess.run(["bash", "-c", 'exec "$@" >&- 2>&-', "bash", sys.executable, "-c", CHILD, str(out)],
                         timeout=60)
    assert res.returncode == 0
    before, fd1, fd2, kid = eval(out.read_text())
    assert before == [True, True] and fd1 == fd2 == os.devnull
    assert kid == 0  # inherited by the processes it starts (the launcher, the ranks)


def test_the_watchdog_remakes_its_run_directory_and_stack_file(tmp_path: Path) -> None:
    import faulthandler

    from ddp_doctor.training.run.watchdog import STACK_SIGNAL, ProgressWatch
    run = tmp_path / "ddp-doctor-run-w"
    run.mkdir(mode=0o700)
    watch = ProgressWatch(str(run), 0, None, interval=0.05).start()
    stack = Path(records.stack_path(str(run), 0))
    try:
        wait_for(lambda: Path(records.heartbeat_path(str(run), 0)).exists(), 10, "the first heartbeat")
        os.rename(run, tmp_path / "gone")  # removed at once (rmtree races the watchdog's writes)
        shutil.rmtree(tmp_path / "gone")
        wait_for(lambda: stack.exists() and Path(records.heartbeat_path(str(run), 0)).exists(), 10,
                 "the run directory, its heartbeat and stack file made again")

        def asked() -> bool:  # the parent asks for stacks at a hang; again until the new file has them
            os.kill(os.getpid(), STACK_SIGNAL)  # (the file shows a moment before faulthandler is moved to it)
            return "most recent call first" in stack.read_text()
        wait_for(asked, 10, "the stacks in the new stack file", interval=0.2)
    finally:
        watch.stop()
        faulthandler.unregister(STACK_SIGNAL)
