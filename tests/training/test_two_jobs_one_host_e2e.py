"""One job, one run directory: two jobs at once on one host never read each
other's records, and two jobs on one MASTER_PORT never produce a pass.

- Two `torchrun --nnodes 1 --nproc-per-node 2 -m ddp_doctor run` jobs (different ports, no
  --standalone: both run ids are torchrun's default "none"). Job A's ranks wait for the test; job
  B's rank 1 raises. Before the fix both used $TMPDIR/ddp-doctor-run-none, and once A's rank 0
  ended, A's report said "fail" with B's error while A's rank 1 still ran.
- Two hand-launched jobs (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, 2 ranks each) on one port.
  Before the fix the second rank 0 said DDP313 while the first job's rank 0 and a rank 1 of either
  job passed and trained together, and the other rank 1 (DDP322) took that pass and hung in
  init_process_group. Each process is held in its local checks (tests/plugins/held_check.py) and
  let go in a known order, so the outcome does not depend on which process the machine runs first.

Real torchrun, real processes; the two scenarios run side by side (one module fixture). The torchrun
pair is a shared launch (helpers/launches.py, two_torchrun_jobs): test_run_e2e.py reads torchrun's
failure summary of job B from it.
"""
from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

import pytest
from helpers.procs import (
    DDP,
    TIMING_WARNINGS,
    assert_clean_output,
    clean_env,
    finish,
    free_port,
    ids,
    kill_tree,
    load_json,
    result_of,
    start,
    wait_for,
)

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "run_scripts"
START_BOUND = 180.0  # interpreters importing torch on a loaded 2-core machine
PREFIX = "ddp_doctor/preflight/0/"  # the preflight's keys of hand-launched ranks (preflight_ranks/one_rank.py)


def _host_checked_in(port: int) -> bool:
    """Rank 0 hosts the store on `port` and has checked in there (its view is in the store)."""
    import torch.distributed as dist

    from ddp_doctor.processes.tcp_store import prefixed
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
        client = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=5), wait_for_workers=False)
        return bool(prefixed(client, PREFIX).check(["view/0"]))
    except Exception:  # noqa: BLE001 - not listening yet
        return False


def _in_store(port: int, key: str) -> bool:
    """The preflight's `key` is in the store on `port`."""
    import torch.distributed as dist

    from ddp_doctor.processes.tcp_store import prefixed
    try:
        client = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=5), wait_for_workers=False)
        return bool(prefixed(client, PREFIX).check([key]))
    except Exception:  # noqa: BLE001 - not listening (yet, or any more)
        return False


def _hand_launched(base: Path) -> dict:
    """Job a and job b, ranks 0 and 1 each, all on one MASTER_PORT. Let go in this order: a's
    rank 0 (it hosts the store), then b's rank 0 (the port is taken: it finds a's rendezvous),
    then both ranks 1 (one of them claims a rank already claimed); a's rank 0 goes on to its
    verdict only once both have been at its store."""
    port = free_port()
    procs = {}
    for name in ("a0", "a1", "b0", "b1"):
        d = base / name
        (d / "held").mkdir(parents=True)
        env = clean_env(RANK=name[1], LOCAL_RANK=name[1], WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TMPDIR=str(base),
                        DDP_DOCTOR_CHECK_MODULES="tests.plugins.held_check"
                        + (",tests.plugins.held_init" if name == "a0" else ""), PYTHONPATH=str(ROOT),
                        HELD_CHECK_DIR=str(d / "held"))
        procs[name] = start([*DDP, "run", "--skip", "communication", "--timeout", "60", "--report",
                             str(d / "r.json"), str(SCRIPTS / "ok_allreduce.py")], env, str(d))

    def release(name: str) -> None:
        (base / name / "held" / "release").touch()

    try:
        for name in procs:
            wait_for(lambda name=name: (base / name / "held" / f"rank-{name[1]}").exists(), START_BOUND,
                     f"process {name} held in its local checks")
        release("a0")
        wait_for(lambda: _host_checked_in(port), 120, "a's rank 0 checked in at the store it hosts")
        release("b0")
        results = {"b0": finish(procs["b0"], 120)}
        release("a1")
        release("b1")
        # a's rank 0 is held as its init returns (tests/plugins/held_init.py), its store up, until
        # both ranks 1 have been there: the first met it, the second found rank 1 claimed
        wait_for(lambda: (base / "a0" / "held" / "init-held").exists() and _in_store(port, "claim/1"), 120,
                 "both ranks 1 at a's store")
        (base / "a0" / "held" / "release-init").touch()
        results.update({name: finish(procs[name], 120) for name in ("a0", "a1", "b1")})
    finally:
        for name, p in procs.items():
            release(name)
            (base / name / "held" / "release-init").touch()
            if p.poll() is None:
                kill_tree(p.pid)
    return {"port": port, "results": results,
            "reports": {n: load_json(str(base / n / ("r.json" if n.endswith("0") else "r.json.rank1.json")))
                        for n in procs}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launches):
    """The two torchrun jobs (a shared launch: helpers/launches.py) beside the hand-launched ones."""
    base = tmp_path_factory.mktemp("two_jobs")
    (base / "hand").mkdir()
    return launches.get("two_torchrun_jobs", own={"hand": lambda: _hand_launched(base / "hand")}, at_once=2)


def test_two_torchrun_jobs_on_one_host_each_report_their_own_job(runs):
    got = runs["two_torchrun_jobs"].result
    # while A's rank 1 still runs, A's report says so: never B's failure
    assert got["a_while_running"]["status"] == "running", got["a_while_running"]
    res_a, rep_a = got["a"], got["a_report"]
    assert res_a.rc == 0, res_a.output
    assert sorted(ln for ln in res_a.stdout.splitlines() if ln.endswith(" done")) == ["rank 0 done", "rank 1 done"]
    assert not ids(rep_a, "error") and ids(rep_a, "warning") <= TIMING_WARNINGS, rep_a["findings"]
    assert "bad batch" not in repr(rep_a)
    res_b, rep_b = got["b"], got["b_report"]
    assert res_b.rc == 1, res_b.output
    assert rep_b["status"] == "fail" and rep_b["root_cause"]["ranks"] == [1], rep_b["findings"]
    assert "bad batch on rank 1" in rep_b["root_cause"]["message"]


def test_each_torchrun_job_has_a_run_directory_of_its_own_though_both_run_ids_are_none(runs):
    dirs = runs["two_torchrun_jobs"].result["run_dirs"]
    assert len(dirs) == 2 and all(d.startswith("ddp-doctor-run-none-") for d in dirs), dirs


def test_two_hand_launched_jobs_on_one_port_all_fail_their_preflight(runs):
    got = result_of(runs, "hand")
    for name, res in got["results"].items():
        assert res.rc == 3, f"{name}: {res.output}"  # preflight failed: the script never started
        assert " sum " not in res.stdout, f"{name} trained: {res.output}"
        assert_clean_output(res)
        assert got["reports"][name]["status"] == "fail", got["reports"][name]


def test_every_process_of_both_jobs_says_two_jobs_share_the_port(runs):
    got = result_of(runs, "hand")
    port, reports = got["port"], got["reports"]
    for name, rep in reports.items():
        assert "DDP846" in ids(rep, "error"), f"{name}: {rep['findings']}"
        assert f"MASTER_PORT={port}" in next(f["message"] for f in rep["findings"] if f["id"] == "DDP846")
    # the rank 0 that could not host names the rank 0 whose rendezvous holds the port
    said = reports["b0"]["root_cause"]
    assert said["id"] == "DDP846" and f"cannot listen on MASTER_PORT={port}" in said["message"], said
    host_pid = next(p["pid"] for p in said["evidence"]["processes"] if p["why"] == "claimed it first")
    assert f"rank 0: pid {host_pid} on host" in said["message"]
    # the reporting rank of the first job counted b's rank 0, which was there before any rank 1
    cause = reports["a0"]["root_cause"]
    assert cause["id"] == "DDP846" and "could not host the store" in cause["message"], cause
    assert "DDP322" in ids(reports["a1"]) | ids(reports["b1"])  # the second claimant of rank 1 says so

