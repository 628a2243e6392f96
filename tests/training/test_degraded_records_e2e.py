"""A job's exit status and verdict are its own, whatever becomes of ddp-doctor's records and
streams. Real processes, under ddp-doctor's own launch and under torchrun:

- TMPDIR on a full file system (a real 64 KiB tmpfs, 12 KiB left) and a read-only run directory
  (--run-dir, DDP_DOCTOR_RUN_DIR): the records move elsewhere with one warning line and a DDP813
  warning; a correct job exits 0, a failing one is named as before (was: exit 3 "DDP003", a report
  left "running", a traceback);
- stdout and stderr closed (`>&- 2>&-`): exit status and report as with them open (was: exit 1
  with a "pass" report, a raised error called a native crash, a report left "running");
- the script removes the run directory, then hangs: it is made again and the hang is judged
  (was: no verdict at all, or a false "pass").

Mounting needs root (or CAP_SYS_ADMIN): without it the tmpfs cases are skipped, saying so, and the
read-only directory is a 0500 one. Every launch starts in the module fixture, three at a time."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.procs import (
    DDP,
    TIMING_WARNINGS,
    Launch,
    assert_clean_output,
    clean_env,
    ids,
    load_json,
    result_of,
    run_all,
)

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
OK, RAISES = str(SCRIPTS / "ok_allreduce.py"), str(SCRIPTS / "rank1_raises.py")
DELETES = str(SCRIPTS / "deletes_run_dir_then_hangs.py")
OWN = [*DDP, "run", "--nproc-per-node", "2"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "ddp_doctor", "run"]
OPTS = ["--skip", "communication", "--timeout", "30", "--report", "r.json"]
CLOSED = ["bash", "-c", 'exec "$@" >&- 2>&-', "bash"]  # the shell's `cmd >&- 2>&-`
MOVED = re.compile(r"ddp-doctor: warning: the run directory cannot hold ddp-doctor's records .*they are kept in "
                   r"(\S+) instead")
PAGES_LEFT = 3  # of 16: Python's own temp dir test passes (one page), ddp-doctor's records would not fit


def _mount(path: Path, *options: str) -> str | None:
    """A 64 KiB tmpfs at `path`; None when mounted, else why not."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=64k", *options)), "tmpfs", str(path)],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if res.returncode == 0 else (res.stderr.strip() or f"mount exited {res.returncode}")


def _fill(path: Path) -> None:
    with open(path / "fill", "wb") as f:
        f.write(b"\0" * (16 - PAGES_LEFT) * 4096)
    left = os.statvfs(path)
    assert left.f_bavail * left.f_frsize == PAGES_LEFT * 4096, "the tmpfs is not as full as the test needs"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("degraded")
    mounts: list[Path] = []
    skipped: dict[str, str] = {}
    jobs: dict[str, Launch] = {}

    def job(name: str, cmd: list[str], *, tmp: Path | None = None, **env: str) -> None:
        where = base / name
        (where / "tmp").mkdir(parents=True, exist_ok=True)
        jobs[name] = Launch(cmd, clean_env(TMPDIR=str(tmp or where / "tmp"), **env), str(where), 180)

    for name, cmd in (("full_own", [*OWN, *OPTS, OK]), ("full_torchrun", [*TORCHRUN, *OPTS, OK]),
                      ("full_torchrun_fails", [*TORCHRUN, *OPTS, RAISES])):
        full = base / name / "full"  # one tmpfs each: a launch must not take another's pages
        why = _mount(full)
        if why:
            skipped[name] = f"cannot mount a tmpfs to fill ({why}): needs root or CAP_SYS_ADMIN"
            continue
        mounts.append(full)
        _fill(full)
        job(name, cmd, tmp=full)

    ro = base / "ro"
    why = _mount(ro, "ro")
    if why is None:
        mounts.append(ro)
    elif os.geteuid() != 0:
        ro.chmod(0o500)  # not root: the mode bits make it read-only
    else:
        skipped["ro_own"] = skipped["ro_torchrun"] = f"root writes through mode bits, and mount failed: {why}"
    if "ro_own" not in skipped:
        job("ro_own", [*OWN, *OPTS, "--run-dir", str(ro / "keep"), OK])
        job("ro_torchrun", [*TORCHRUN, *OPTS, OK], DDP_DOCTOR_RUN_DIR=str(ro / "rd"))

    for name, cmd in (("closed_own", [*OWN, *OPTS, OK]), ("closed_own_fails", [*OWN, *OPTS, RAISES]),
                      ("closed_torchrun", [*TORCHRUN, *OPTS, OK]),
                      ("closed_torchrun_fails", [*TORCHRUN, *OPTS, RAISES])):
        job(name, [*CLOSED, *cmd])
    for name, cmd in (("deleted_own", OWN), ("deleted_torchrun", TORCHRUN)):
        job(name, [*cmd, *OPTS, "--hang-timeout", "3", DELETES])

    results: dict = {}
    try:
        results = run_all(jobs, at_once=3)
        yield {"base": base, "results": results, "skipped": skipped}
    finally:
        for m in mounts:
            if subprocess.run(["umount", str(m)], capture_output=True, timeout=30).returncode != 0:
                subprocess.run(["umount", "-l", str(m)], capture_output=True, timeout=30)
        for res in results.values():  # what an outside launcher moved to /dev/shm stays there: remove it
            for moved in MOVED.findall(getattr(res, "stderr", "")):
                if os.path.basename(moved).startswith("ddp-doctor-run-") and not moved.startswith(str(base)):
                    shutil.rmtree(moved, ignore_errors=True)


def launched(runs, name: str):
    if name in runs["skipped"]:
        pytest.skip(runs["skipped"][name])
    return result_of(runs["results"], name)


def report(runs, name: str) -> dict:
    return load_json(str(runs["base"] / name / "r.json"))


def assert_passes_with_records_moved(rep: dict) -> dict:
    """A correct job: no errors; DDP813 (and load-dependent timing warnings) the only warnings."""
    assert not ids(rep, "error"), rep["findings"]
    assert ids(rep, "warning") - TIMING_WARNINGS == {"DDP813"}, rep["findings"]
    assert rep["status"] == "warn"
    return next(f for f in rep["findings"] if f["id"] == "DDP813")


def test_full_tmpdir_a_correct_job_passes_with_a_warning_under_its_own_launch(runs):
    res = launched(runs, "full_own")
    assert res.rc == 0, res.output  # was 3: "preflight FAIL DDP003"
    assert "rank 0 sum 3.0" in res.stdout and "rank 1 sum 3.0" in res.stdout
    moved = MOVED.findall(res.stderr)
    assert len(moved) == 1, res.stderr  # one line, from the parent
    found = assert_passes_with_records_moved(report(runs, "full_own"))
    assert "full: 12 KiB free" in found["message"] and moved[0] in found["message"], found
    assert found["ranks"] == [0, 1] and not os.path.exists(moved[0])  # removed at the end, as ever


def test_full_tmpdir_a_correct_job_under_torchrun_ends_in_its_verdict(runs):
    res = launched(runs, "full_torchrun")
    assert res.rc == 0, res.output
    assert len(MOVED.findall(res.stderr)) == 1, res.stderr  # one line per node (its local rank 0)
    rep = report(runs, "full_torchrun")
    assert rep["status"] in ("pass", "warn") and not ids(rep, "error"), rep  # was: "running", forever


def test_full_tmpdir_a_failing_job_under_torchrun_names_its_cause(runs):
    res = launched(runs, "full_torchrun_fails")
    assert res.rc == 1, res.output
    rep = report(runs, "full_torchrun_fails")
    assert rep["status"] == "fail" and rep["root_cause"]["ranks"] == [1] and "DDP800" in ids(rep), rep


def test_an_unwritable_run_dir_moves_the_records_and_the_job_passes(runs):
    res = launched(runs, "ro_own")
    assert res.rc == 0, res.output  # was 2: "--run-dir ...: cannot make the run directory there"
    found = assert_passes_with_records_moved(report(runs, "ro_own"))
    assert str(runs["base"] / "ro") in found["message"], found
    assert re.search(r"Read-only file system|Permission denied", found["message"]), found
    kept = MOVED.findall(res.stderr)[0]  # --run-dir asked to keep them: kept where they went
    assert kept.startswith(str(runs["base"] / "ro_own" / "tmp")) and os.path.isdir(kept)


def test_an_unwritable_ddp_doctor_run_dir_under_torchrun_is_no_traceback(runs):
    res = launched(runs, "ro_torchrun")
    assert res.rc == 0, res.output  # was 1: OSError [Errno 30] on every rank, no report
    assert_clean_output(res)
    rep = report(runs, "ro_torchrun")
    assert rep["status"] in ("pass", "warn") and not ids(rep, "error"), rep


@pytest.mark.parametrize("name", ["closed_own", "closed_torchrun"])
def test_closed_stdout_and_stderr_a_correct_job_passes(runs, name):
    res = launched(runs, name)
    assert res.rc == 0 and res.output == "", res.output  # was 1, with a "pass" report
    rep = report(runs, name)
    assert rep["status"] in ("pass", "warn") and not ids(rep, "error") and rep["phase"] == "training", rep


@pytest.mark.parametrize("name", ["closed_own_fails", "closed_torchrun_fails"])
def test_closed_stdout_and_stderr_a_failing_job_names_the_error_it_raised(runs, name):
    res = launched(runs, name)
    path = runs["base"] / name / "r.json"
    assert res.rc == 1, (res.output, path.read_text() if path.exists() else "no report")  # stdout is closed
    rep = report(runs, name)  # was: DDP803 "no Python error" (own launch), "running" (torchrun)
    assert rep["status"] == "fail" and rep["root_cause"]["ranks"] == [1], rep
    cause = next(f for f in rep["findings"] if f["id"] == "DDP800")
    assert "ValueError: bad batch on rank 1" in cause["message"]


def test_a_removed_run_directory_is_made_again_and_the_hang_is_judged(runs):
    res = launched(runs, "deleted_own")
    assert res.rc == 124, res.output  # was: no verdict at all, the job waited on
    assert "was removed while the job ran: made again" in res.stderr
    rep = report(runs, "deleted_own")
    assert rep["status"] == "fail" and "DDP801" in ids(rep) and rep["root_cause"]["ranks"] == [1], rep


def test_a_removed_run_directory_under_torchrun_keeps_the_hang_on_record(runs):
    res = launched(runs, "deleted_torchrun")
    assert res.rc != 0, res.output
    removed = re.search(r"^deleted (\S+)$", res.stderr, re.M).group(1)
    outcomes = [load_json(str(p)) for p in Path(removed).glob("rank-*.json")]
    assert any(o.get("hung") for o in outcomes), (os.listdir(removed), res.stderr)
    # was "pass": the failure's records were lost with the directory. (A hang under an outside
    # launcher whose ranks all reach the bound in one second leaves "running": no rank writes the
    # verdict, with or without this fault.)
    assert report(runs, "deleted_torchrun")["status"] != "pass"
