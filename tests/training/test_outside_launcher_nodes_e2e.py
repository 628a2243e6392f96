"""Never a false "pass" under an outside launcher on several nodes: two torchrun
launchers (`--nnodes 2`, node ranks 0 and 1) on this host, each node with its own temp dir (its run
directory) and its own working directory (its report), as two hosts have. Every rank puts its
ending in the job's store; "pass" needs every rank's; a rank seen gone on its node is named on the
other node; the S3 copy (moto's server on loopback, unchanged boto3) holds the last verdict.

The scenarios start together (module fixture); each test reads its own.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers.procs import (
    TIMING_WARNINGS,
    clean_env,
    finish,
    free_port,
    ids,
    kill_tree,
    result_of,
    run_all,
    start,
    wait_for,
)

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
BUCKET = "ddp-reports"


def _torchrun(node: int, nproc: int, port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
            "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port),
            "--max-restarts", "0", "-m", "ddp_doctor", "run", "--skip", "communication", "--report", "r.json"]


def _job(base: Path, name: str, script: str, nproc: int, node0_done=None, **env: str):
    """Both nodes of one job, started together and finished (bounded; no survivors). When node 1's
    rank fails after node 0's ended well, node 0's launcher waits in torchrun's exit barrier for
    node 1's (300 s, torchrun's own behaviour): once `node0_done(node 0's home)` holds, the test
    has what it reads, and ends that launcher."""
    def run() -> dict[int, object]:
        port = free_port()
        procs, homes = {}, {}
        try:
            for node in (0, 1):
                homes[node] = base / name / f"node{node}"
                (homes[node] / "tmp").mkdir(parents=True)
                procs[node] = start([*_torchrun(node, nproc, port), str(SCRIPTS / script)],
                                    clean_env(TMPDIR=str(homes[node] / "tmp"), **env), str(homes[node]))
            out = {1: finish(procs[1], 240.0)}
            if node0_done is not None:
                wait_for(lambda: procs[0].poll() is not None or node0_done(homes[0]), 120, "node 0's verdict")
                if procs[0].poll() is None:
                    kill_tree(procs[0].pid)
            out[0] = finish(procs[0], 240.0)
            return out
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    kill_tree(proc.pid)
    return run


def _status(home: Path) -> str | None:
    import json
    try:
        return json.loads((home / "r.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


def _rank0_gone(home: Path) -> bool:
    """Rank 0 recorded its ending and its process is gone: it had its last word."""
    import json

    from ddp_doctor.training.run.ledger import process_gone
    for p in (home / "tmp").glob("ddp-doctor-run-*/rank-0.json"):
        try:
            return process_gone(json.loads(p.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return False
    return False


@pytest.fixture(scope="module")
def s3():
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    import logging
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    creds = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "AKIAFAKEFAKEFAKE1234",
             "AWS_SECRET_ACCESS_KEY": "fake-secret-for-moto", "AWS_DEFAULT_REGION": "us-east-1",
             "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent/ddp-doctor-tests/aws",
             "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/ddp-doctor-tests/aws"}
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"])
    client.create_bucket(Bucket=BUCKET)
    yield {"env": creds, "client": client}
    server.stop()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, s3):
    base = tmp_path_factory.mktemp("nodes")
    launches = {
        # rank 3 (node 1) killed mid-training: rank 2 sees its process gone, ranks 0-1 only a lost peer
        "killed": _job(base, "killed", "rank_oom_killed.py", 2, OOM_RANK="3",
                       DDP_DOCTOR_REPORT_S3_URI=f"s3://{BUCKET}/killed/report.json", **s3["env"]),
        # rank 1 (node 1) fails after training, while rank 0 (node 0) has ended well
        "late": _job(base, "late", "rank1_fails_after_the_group.py", 1,
                     node0_done=lambda home: _status(home) not in (None, "running")),
        # rank 1 fails only once rank 0's process is gone: rank 0 could not know, and must not say pass
        "after": _job(base, "after", "rank1_fails_after_rank0_ended.py", 1, node0_done=_rank0_gone,
                      DDP_DOCTOR_JOB_END_WAIT="2"),
        "ok": _job(base, "ok", "ok_allreduce.py", 1),
    }
    return {"base": base, "results": run_all(launches, at_once=2)}


def _report(jobs, name: str, node: int) -> dict | None:
    import json
    path = jobs["base"] / name / f"node{node}" / "r.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_a_rank_killed_on_another_node_is_the_root_cause_on_both_nodes_and_in_s3(jobs, s3):
    import json
    res = result_of(jobs["results"], "killed")
    assert res[0].rc != 0 and res[1].rc != 0, (res[0].output, res[1].output)
    for node in (0, 1):
        rep = _report(jobs, "killed", node)
        assert rep is not None and rep["status"] == "fail", (node, rep, res[node].output)
        cause = rep["root_cause"]
        said = [(f["id"], f.get("ranks"), f["message"][:300]) for f in rep["findings"]]  # short: whole in CI's log
        assert cause["id"] == "DDP803" and cause["ranks"] == [3], (node, said, res[node].stderr[-3000:])
    body = s3["client"].get_object(Bucket=BUCKET, Key="killed/report.json")["Body"].read()
    uploaded = json.loads(body)
    assert uploaded["status"] == "fail" and uploaded["root_cause"]["ranks"] == [3], uploaded


def test_a_failure_on_another_node_after_rank_0_ended_well_is_the_verdict_on_node_0(jobs):
    res = result_of(jobs["results"], "late")
    assert res[1].rc == 1, res[1].output  # node 0's launcher waited in torchrun's exit barrier: ended
    for node in (0, 1):
        rep = _report(jobs, "late", node)
        assert rep is not None and rep["status"] == "fail", (node, rep, res[node].output)
        assert rep["root_cause"]["ranks"] == [1], (node, rep["findings"])
        assert "No space left on device" in rep["root_cause"]["message"]


def test_rank_0_never_says_pass_while_a_rank_of_another_node_still_runs(jobs):
    res = result_of(jobs["results"], "after")
    assert res[1].rc == 1, (res[0].output, res[1].output)
    rep0, rep1 = _report(jobs, "after", 0), _report(jobs, "after", 1)
    assert rep0 is not None and rep0["status"] == "running", rep0  # rank 0 could not know the verdict
    assert "had not ended after 2 s" in res[0].stderr, res[0].stderr
    assert rep1 is not None and rep1["status"] == "fail" and rep1["root_cause"]["ranks"] == [1], rep1


def test_a_job_that_ended_well_on_every_node_passes_where_rank_0_is(jobs):
    res = result_of(jobs["results"], "ok")
    assert res[0].rc == 0 and res[1].rc == 0, (res[0].output, res[1].output)
    rep0 = _report(jobs, "ok", 0)
    assert rep0 is not None, res[0].output
    assert rep0["status"] == "pass" or ids(rep0, "warning") <= TIMING_WARNINGS, rep0["findings"]
    rep1 = _report(jobs, "ok", 1)  # written only when node 1's rank was the last of the job to end
    assert rep1 is None or rep1["status"] in ("pass", "warn"), rep1
