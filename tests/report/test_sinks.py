"""Sinks: the JSON report, SageMaker's failure file, torchelastic's error file, the stderr line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from ddp_doctor.report import sinks

ROOT = Path(__file__).resolve().parents[2]
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def finding(id: str, title: str, message: str, *, severity: str = "error", ranks: list[int] | None = None,
            hint: str = "Do the obvious thing.", **extra: Any) -> dict[str, Any]:
    return {"id": id, "category": "launcher_env", "severity": severity, "title": title,
            "message": message, "hint": hint, "ranks": ranks if ranks is not None else [1],
            "evidence": extra.pop("evidence", {}), "phase": "preflight", "time": 1700000000.0, "caused_by": None,
            **extra}


def make_report(findings: list[dict[str, Any]] | None = None, status: str = "fail") -> dict[str, Any]:
    if findings is None:
        findings = [
            finding("DDP101", "WORLD_SIZE does not match the launched ranks",
                    "WORLD_SIZE=4 but 2 ranks were launched (torchrun --nproc-per-node 2).",
                    hint="Set --nnodes/--nproc-per-node so that nnodes x nproc-per-node = WORLD_SIZE.",
                    ranks=[0, 1]),
            finding("DDP201", "Master unreachable", "127.0.0.1:29500 refused the connection.", ranks=[1]),
            finding("DDP301", "Slow all_reduce", "busbw 0.1 GB/s.", severity="warning", ranks=[0]),
        ]
    errors = [f for f in findings if f["severity"] == "error"]
    return {
        "schema": "ddp-doctor.report", "schema_version": 1, "tool_version": "0.1.0",
        "status": status, "phase": "preflight",
        "world": {"launcher": "torchrun", "backend": "gloo", "world_size": 2, "nnodes": 1,
                  "nproc_per_node": 2, "master_addr": "127.0.0.1", "master_port": 29500},
        "ranks": [{"rank": 0, "local_rank": 0, "node_rank": 0, "host": "h", "device": "cpu"}],
        "findings": findings, "measurements": {},
        "root_cause": errors[0] if errors else None,
    }


# ---------------------------------------------------------------- JSON report
def test_report_file_is_written_atomically_in_new_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "report.json"
    assert sinks.write_report_file(make_report(), str(path)) is None
    assert json.loads(path.read_text())["findings"][0]["id"] == "DDP101"
    assert os.listdir(path.parent) == ["report.json"]  # no temp file left behind
    # Overwriting replaces the whole file.
    assert sinks.write_report_file(make_report(status="pass", findings=[]), str(path)) is None
    assert json.loads(path.read_text())["status"] == "pass"


def test_failed_replace_keeps_the_old_report_and_leaves_no_temp(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "report.json"
    path.write_text('{"old": true}')

    def boom(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(sinks.os, "replace", boom)
    err = sinks.write_report_file(make_report(), str(path))
    assert err and "No space left" in err and str(path) in err
    assert json.loads(path.read_text()) == {"old": True}
    assert os.listdir(tmp_path) == ["report.json"]


def test_unwritable_path_returns_an_error_and_does_not_raise(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where a directory is needed (root ignores chmod)
    err = sinks.write_report_file(make_report(), str(blocker / "sub" / "report.json"))
    assert isinstance(err, str) and "could not write report" in err
    err = sinks.write_sagemaker_failure(make_report(), root=str(blocker))
    assert isinstance(err, str) and "failure file" in err
    err = sinks.write_torchelastic_error_file(make_report(), str(blocker / "error.json"))
    assert isinstance(err, str) and "torchelastic" in err


def test_report_with_unserialisable_evidence_is_still_written(tmp_path: Path) -> None:
    rep = make_report([finding("DDP101", "t", "m", evidence={"path": Path("/x"), "when": object()})])
    assert sinks.write_report_file(rep, str(tmp_path / "r.json")) is None
    assert json.loads((tmp_path / "r.json").read_text())["findings"][0]["evidence"]["path"] == "/x"


# ---------------------------------------------------------------- diagnosis text
def test_diagnosis_names_root_cause_first_then_other_errors() -> None:
    text = sinks.diagnosis_text(make_report())
    assert text.startswith("ddp-doctor: fail: [DDP101] WORLD_SIZE does not match the launched ranks "
                           "on ranks 0-1: WORLD_SIZE=4 but 2 ranks")
    assert "Fix: Set --nnodes" in text
    assert text.index("DDP101") < text.index("Other errors: [DDP201] Master unreachable on rank 1")
    assert "DDP301" not in text  # warnings are not errors
    assert "\n" not in text


def test_diagnosis_fits_the_limit_without_cutting_a_word() -> None:
    words = [f"word{i:04d}" for i in range(400)]
    others = [finding(f"DDP{200 + i}", f"Another error number {i}", "m") for i in range(30)]
    rep = make_report([finding("DDP101", "Root", " ".join(words))] + others)
    text = sinks.diagnosis_text(rep)
    assert len(text) <= 900 and text.endswith("…")
    assert text[:-1].split()[-1] in words  # the last word before the ellipsis is whole
    # A short root cause leaves room for other errors, then says how many did not fit.
    rep = make_report([finding("DDP101", "Root", "short")] + others)
    text = sinks.diagnosis_text(rep)
    assert len(text) <= 900 and "[DDP200] Another error number 0" in text
    assert text.endswith(" more)") and "DDP229" not in text
    assert len(sinks.diagnosis_text(rep, limit=120)) <= 120


def test_diagnosis_without_errors_and_with_a_broken_report() -> None:
    text = sinks.diagnosis_text(make_report([finding("DDP301", "Slow", "m", severity="warning")], status="warn"))
    assert text.startswith("ddp-doctor: warn: no errors, 1 warning(s).") and "DDP301" in text
    assert sinks.diagnosis_text({"status": "fail", "findings": "garbage"}).startswith("ddp-doctor: fail")


def test_sm_failure_line_is_one_line_naming_an_exception_the_toolkit_watches() -> None:
    rep = make_report([finding("DDP101", "Root", "a\nmultiline " + "x " * 400)])
    line = sinks.sm_failure_line(rep)
    assert "\n" not in line and line.startswith("DDPDoctorPreflightError")
    # sagemaker-training-toolkit starts capturing FailureReason at a line containing a name
    # from its _PYTHON_ERRORS_ list, which has RuntimeError but not our class.
    assert "RuntimeError" in line and "[DDP101] Root" in line
    assert len(line) <= len("DDPDoctorPreflightError (RuntimeError): ") + 300


def test_one_process_of_a_host_gives_the_toolkit_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # every rank of a failed preflight writes the failure file (first writer wins); the stderr line the
    # toolkit reads is said by the reporting rank and by each host's local rank 0, not by all ranks
    from types import SimpleNamespace

    from ddp_doctor.report.publish import Output, deliver
    rep = make_report([finding("DDP101", "Root", "m")])
    for rank, local, reporter, said in ((0, 0, True, 1), (1, 1, False, 0), (8, 0, False, 1)):
        ctx = SimpleNamespace(rank=rank, local_rank=local, env={}, sagemaker=SimpleNamespace(root=str(tmp_path)))
        deliver(rep, ctx, Output(report_path=str(tmp_path / "r.json"), quiet=True), reporter=reporter)
        assert capsys.readouterr().err.count("(RuntimeError): ") == said, (rank, local)


# ---------------------------------------------------------------- SageMaker failure file
def test_sagemaker_failure_file_first_writer_wins(tmp_path: Path) -> None:
    first, second = make_report(), make_report([finding("DDP999", "Second writer", "m")])
    assert sinks.write_sagemaker_failure(first, root=str(tmp_path)) is None
    failure = tmp_path / "output" / "failure"
    text = failure.read_text()
    assert text == sinks.diagnosis_text(first) and "[DDP101]" in text[:900]
    report = json.loads((tmp_path / "output" / "data" / "ddp-doctor-report.json").read_text())
    assert report["root_cause"]["id"] == "DDP101"
    assert sinks.write_sagemaker_failure(second, root=str(tmp_path)) == sinks.ALREADY_WRITTEN
    assert failure.read_text() == text


@pytest.mark.slow
def test_sagemaker_failure_race_has_exactly_one_winner(tmp_path: Path) -> None:
    from helpers.procs import wait_for_line
    code = textwrap.dedent("""
        import sys
        from ddp_doctor.report import sinks
        from tests.report.test_sinks import finding, make_report
        rep = make_report([finding("DDP1%02d" % int(sys.argv[1]), "writer " + sys.argv[1], "m")])
        print("ready", flush=True)
        sys.stdin.readline()  # the start: every writer is ready
        print(sinks.write_sagemaker_failure(rep, root=sys.argv[2]))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i), str(tmp_path)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for i in range(6)]
    try:
        for p in procs:  # all six imported and built their report: then they write at once
            wait_for_line(p.stdout, r"^ready$", 60)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert sorted(outs) == ["None"] + [sinks.ALREADY_WRITTEN] * 5
    winner = outs.index("None")
    assert f"[DDP1{winner:02d}] writer {winner}" in (tmp_path / "output" / "failure").read_text()


def test_sagemaker_failure_does_nothing_when_the_preflight_passed(tmp_path: Path) -> None:
    assert sinks.write_sagemaker_failure(make_report([], status="pass"), root=str(tmp_path)) is None
    assert not (tmp_path / "output").exists()


# ---------------------------------------------------------------- torchelastic error file
def test_torchelastic_error_file_format_is_what_torch_reads(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "attempt_0" / "0" / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    before = int(time.time())
    assert sinks.write_torchelastic_error_file(make_report()) is None
    data = json.loads(path.read_text())
    assert set(data) == {"message"} and set(data["message"]) == {"message", "extraInfo"}
    msg = data["message"]
    assert msg["message"] == "DDPDoctorPreflightError: " + sinks.diagnosis_text(make_report())
    assert set(msg["extraInfo"]) == {"py_callstack", "timestamp"}
    assert isinstance(msg["extraInfo"]["timestamp"], str) and int(msg["extraInfo"]["timestamp"]) >= before
    # the diagnosis alone: torchrun prints it per failed rank; the full report is printed once, elsewhere
    assert msg["extraInfo"]["py_callstack"] == msg["message"] + "\n" and "DDP201" in msg["message"]

    # torch's agent parses it into the failure it names as root cause.
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=3, error_file=str(path))
    assert failure.message == msg and failure.timestamp == int(msg["extraInfo"]["timestamp"])
    summary = str(ChildFailedError("train.py", {0: failure}))
    assert "DDPDoctorPreflightError: ddp-doctor: fail: [DDP101]" in summary


def test_torchelastic_error_file_only_when_set_and_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    assert sinks.write_torchelastic_error_file(make_report()) is None
    assert os.listdir(tmp_path) == []
    # A passing preflight leaves no file: the agent would blame it for a later training failure.
    path = tmp_path / "error.json"
    assert sinks.write_torchelastic_error_file(make_report([], status="pass"), str(path)) is None
    assert not path.exists()


TORCHRUN_SCRIPT = """
import sys
from ddp_doctor.report import sinks
from tests.report.test_sinks import make_report
err = sinks.write_torchelastic_error_file(make_report())
sys.exit(3 if err is None else 99)
"""


@pytest.mark.slow
def test_torchrun_summary_names_our_diagnosis(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               AWS_SECRET_ACCESS_KEY=SECRET)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "1", str(script)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    err = proc.stderr
    assert "exitcode  : 3" in err, err
    root = err[err.index("Root Cause (first observed failure):"):]
    assert "DDPDoctorPreflightError: ddp-doctor: fail: [DDP101] WORLD_SIZE does not match" in root, err
    assert "To enable traceback see" not in root  # torch read our file rather than making up a message
    assert SECRET not in err


# ---------------------------------------------------------------- secrets
def test_planted_secret_never_reaches_any_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    rep = make_report([
        finding("DDP101", "Leaky", f"env has AWS_SECRET_ACCESS_KEY={SECRET} and bare {SECRET} too",
                hint=f"rotate {SECRET}", evidence={"AWS_SECRET_ACCESS_KEY": SECRET, "cmd": f"x {SECRET}"}),
    ])
    assert sinks.write_report_file(rep, str(tmp_path / "report.json")) is None
    assert sinks.write_sagemaker_failure(rep, root=str(tmp_path / "ml")) is None
    assert sinks.write_torchelastic_error_file(rep, str(tmp_path / "error.json")) is None
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 4
    for p in files:
        text = p.read_text()
        assert SECRET not in text and "***" in text, p
    assert SECRET not in sinks.sm_failure_line(rep) and SECRET not in sinks.diagnosis_text(rep)
    assert rep["findings"][0]["evidence"]["AWS_SECRET_ACCESS_KEY"] == SECRET  # caller's dict untouched


def test_sinks_module_does_not_import_torch() -> None:
    code = "import sys, ddp_doctor.report.sinks, ddp_doctor.cli.env_summary; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_a_report_to_dev_null_a_pipe_or_dev_stdout_is_written_into_never_renamed_over(tmp_path: Path) -> None:
    import stat
    rep = make_report(status="pass", findings=[])
    assert sinks.write_report_file(rep, os.devnull) is None
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)  # still the device (as root a rename would replace it)
    assert not list(Path(os.path.dirname(os.devnull)).glob("null.*.tmp"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # a FIFO nobody reads: an error at once, never a wait
    assert "could not write report" in (sinks.write_report_file(rep, str(fifo)) or "")
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while (err := sinks.write_report_file(rep, str(fifo))) is not None:  # until cat has it open
            assert time.monotonic() < deadline, err
    finally:
        out, _ = reader.communicate(timeout=10)
    assert json.loads(out)["status"] == "pass" and stat.S_ISFIFO(os.stat(fifo).st_mode)
    # /dev/stdout of a child whose stdout is a file: the JSON lands in that file, /dev/stdout stays a link
    out_file = tmp_path / "out.txt"
    code = textwrap.dedent(f"""
        import sys
        from ddp_doctor.report import sinks
        print("before", flush=True)
        sys.exit(sinks.write_report_file({rep!r}, "/dev/stdout") is not None)
    """)
    with open(out_file, "w") as f:
        assert subprocess.run([sys.executable, "-c", code], stdout=f, timeout=60).returncode == 0
    text = out_file.read_text()
    assert text.startswith("before\n{") and json.loads(text[len("before\n"):])["status"] == "pass"
    assert os.path.islink("/dev/stdout")
    # a plain file under /dev (a tmpfs such as /dev/shm) is a file: replaced whole, as anywhere else
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        shm = f"/dev/shm/ddp-doctor-test-{os.getpid()}.json"
        try:
            for status in ("fail", "pass"):
                assert sinks.write_report_file(make_report(status=status, findings=[]), shm) is None
            assert json.loads(Path(shm).read_text())["status"] == "pass"
        finally:
            os.unlink(shm)
