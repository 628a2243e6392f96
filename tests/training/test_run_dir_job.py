"""One job, one run directory, without launching jobs: which directory a rank
under an outside launcher takes (run_dir.job_id), and the job token that keeps another job's
records out of this job's verdict (records.join_job)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ddp_doctor.training import records
from ddp_doctor.training.run import ledger, run_dir
from ddp_doctor.training.run.watched_rank import run_dir_for


@pytest.fixture(autouse=True)
def no_job():
    """Each test starts and ends with no job token in this process."""
    records.join_job(None)
    yield
    records.join_job(None)


def _torchrun(local_rank: int, log_dir: str, run_id: str = "none", attempt: int = 0) -> dict[str, str]:
    return {"TORCHELASTIC_RUN_ID": run_id, "RANK": str(local_rank), "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": str(attempt),
            "TORCHELASTIC_ERROR_FILE": f"{log_dir}/attempt_{attempt}/{local_rank}/error.json"}


def test_under_torchrun_the_ranks_of_one_agent_share_a_directory_and_another_agent_gets_another():
    a0, a1 = _torchrun(0, "/tmp/torchelastic_ab12/none_x1"), _torchrun(1, "/tmp/torchelastic_ab12/none_x1")
    b0 = _torchrun(0, "/tmp/torchelastic_cd34/none_y2")
    assert run_dir.job_id(a0) == run_dir.job_id(a1)  # the ranks of one node of one job
    assert run_dir.job_id(a0) != run_dir.job_id(b0)  # both run ids are "none": still two jobs
    assert run_dir.job_id(a0).startswith("none-")
    # a restarted worker group is a new attempt: its own directory
    assert run_dir.job_id(_torchrun(0, "/tmp/torchelastic_ab12/none_x1", attempt=1)) != run_dir.job_id(a0)


def test_without_torchelastics_error_file_the_agent_is_the_parent_process():
    env = {"TORCHELASTIC_RUN_ID": "none", "RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_ERROR_FILE": ""}
    me = run_dir.job_id(env)
    assert me == run_dir.job_id({**env, "RANK": "1"})  # a sibling rank: the same parent
    code = ("import sys; from ddp_doctor.training.run import run_dir; "
            "print(run_dir.job_id({'TORCHELASTIC_RUN_ID': 'none', 'RANK': '0', 'WORLD_SIZE': '2'}))")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() != me  # its parent is this process: another agent, another job


def test_a_process_is_named_by_its_pid_and_start_time_so_a_reused_pid_is_another():
    mine = run_dir.process_identity(os.getpid())
    assert mine == run_dir.process_identity(os.getpid()) and mine.startswith(f"{os.getpid()}@")
    with open(f"/proc/{os.getpid()}/stat", encoding="utf-8") as f:
        assert f.read().rpartition(")")[2].split()[19] in mine
    assert run_dir.process_identity(2**22 + 12345) == str(2**22 + 12345)  # no such process: the pid alone


@pytest.mark.parametrize("env, other", [
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_ess_base_jobid": "123"},
     {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_ess_base_jobid": "456"}),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "77"},
     {"SLURM_PROCID": "0", "SLURM_STEP_ID": "1", "SLURM_JOB_ID": "77"}),  # two steps of one allocation
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29501"}),
])
def test_other_launchers_jobs_are_told_apart(env, other):
    assert run_dir.job_id(env) != run_dir.job_id(other)
    assert run_dir.job_id(env) == run_dir.job_id({**env})


def test_run_dir_for_is_in_the_temp_dir_with_a_safe_name(tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    got = run_dir_for({"TORCHELASTIC_RUN_ID": "../../etc x", "RANK": "0", "WORLD_SIZE": "1"})
    assert os.path.dirname(got) == str(tmp_path)
    assert os.path.basename(got).startswith("ddp-doctor-run-.._.._etc_x-")
    assert run_dir_for({"DDP_DOCTOR_RUN_DIR": "/kept/here"}) == "/kept/here"


def test_readers_keep_this_jobs_records_and_those_that_name_none(tmp_path):
    d = str(tmp_path)
    records.join_job("other")
    records.write_outcome(d, 1, {"exit_code": 1, "exception": {"type": "RuntimeError", "message": "not ours"}})
    records.write_ledger(d, 1, {"position": "failed"})
    records.join_job(None)
    records.write_outcome(d, 2, {"exit_code": 0})  # written before its preflight ended: names no job
    records.join_job("mine")
    records.write_outcome(d, 0, {"exit_code": 0})
    assert records.read_outcomes(d)[0]["job"] == "mine"
    assert sorted(records.read_outcomes(d)) == [0, 2] and records.read_ledgers(d) == {}
    assert sorted(run_dir.read_run(d).outcomes) == [0, 2]
    records.join_job(None)  # a reader with no job (the parent of its own run): every record
    assert sorted(records.read_outcomes(d)) == [0, 1, 2]


def test_another_jobs_heartbeat_never_makes_a_rank_gone_or_live(tmp_path):
    d = str(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, timeout=60)
    gone_pid = int(dead.stdout)
    now = time.time()
    records.join_job("other")
    records.write_json(records.heartbeat_path(d, 1), {"rank": 1, "pid": gone_pid, "phase": "training",
                                                      "time": now, "job": "other"})
    records.write_json(records.heartbeat_path(d, 2), {"rank": 2, "pid": os.getpid(), "phase": "training",
                                                      "time": now, "job": "other"})
    records.join_job("mine")
    assert ledger.vanished_ranks(d, but=0) == {} and ledger.live_ranks(d, but=0) == []
    records.join_job("other")  # the same records, read by that job: rank 1 is gone, rank 2 lives
    assert list(ledger.vanished_ranks(d, but=0)) == [1] and ledger.live_ranks(d, but=0) == [2]


def test_a_failed_rank_sees_a_peer_vanish_while_it_looks_and_a_peer_that_ends_is_not_gone(tmp_path):
    """A SIGKILLed peer closes its sockets before the kernel marks it a zombie: the failed rank
    that looks then sees it alive, and `settle` waits (bounded) for it to end or vanish."""
    from concurrent.futures import ThreadPoolExecutor
    d = str(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        records.join_job("mine")
        now = time.time()
        for r, pid in ((1, child.pid), (2, os.getpid())):
            records.write_json(records.heartbeat_path(d, r), {"rank": r, "pid": pid, "phase": "training",
                                                              "time": now, "job": "mine"})
        assert ledger.vanished_ranks(d, but=0) == {}  # both alive, no settling asked
        with ThreadPoolExecutor(1) as pool:
            looking = pool.submit(ledger.vanished_ranks, d, 0, 0.0, 120.0)
            records.write_outcome(d, 2, {"exit_code": 1, "exception": None})  # rank 2 ends: not gone
            child.stdin.close()
            child.wait(timeout=60)  # rank 1 vanishes (reaped, as its launcher does)
            assert list(looking.result(timeout=180)) == [1]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=60)


def test_settling_is_bounded_when_a_peer_stays_alive(tmp_path):
    d = str(tmp_path)
    records.join_job("mine")
    records.write_json(records.heartbeat_path(d, 1), {"rank": 1, "pid": os.getpid(), "phase": "training",
                                                      "time": time.time(), "job": "mine"})
    assert ledger.vanished_ranks(d, but=0, settle=0.2) == {}


def test_damaged_times_read_as_old_records_never_a_traceback(tmp_path):
    (tmp_path / "probe-1.json").write_text('{"started": "soon"}')
    (tmp_path / "init-1.json").write_text('{"time": "later"}')
    (tmp_path / "init-2.json").write_text('{"time": 5}')
    assert records.read_probes(str(tmp_path), since=1.0) == []
    assert [c["time"] for c in records.read_init_calls(str(tmp_path))] == ["later", 5]


def test_ranks_started_by_hand_inside_a_slurm_allocation_are_told_apart_by_their_port():
    job = {"SLURM_JOB_ID": "77", "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1"}
    assert run_dir.job_id({**job, "MASTER_PORT": "29500"}) != run_dir.job_id({**job, "MASTER_PORT": "29501"})


def test_a_request_for_stacks_that_lands_at_exit_never_ends_the_process(tmp_path):
    """faulthandler puts back the handler it found when the interpreter exits: the watchdog sets
    "ignore" first, so SIGUSR2 then (a peer at its hang bound asking for stacks) is harmless."""
    code = (
        "import faulthandler, os, signal, types\n"
        "from ddp_doctor.training.run.watchdog import STACK_SIGNAL, ProgressWatch\n"
        f"w = types.SimpleNamespace(run_dir={str(tmp_path)!r}, rank=0, _stack_file=None)\n"
        "ProgressWatch.open_stack_file(w)\n"
        "faulthandler.unregister(STACK_SIGNAL)  # what the interpreter's exit does\n"
        "os.kill(os.getpid(), STACK_SIGNAL)\n"
        "print('still here')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "still here" in done.stdout, (done.returncode, done.stderr)
