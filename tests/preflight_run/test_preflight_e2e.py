"""End-to-end preflight on real processes: torchrun launches, hand-started ranks, real gloo groups."""
from __future__ import annotations

import json
import socket
import sys

import pytest
from helpers.procs import DDP, assert_clean_output, assert_healthy, clean_env, free_port, ids, load_json, run, run_ranks

pytestmark = pytest.mark.slow
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def test_self_launch_cpu_default_passes(tmp_path):
    report = tmp_path / "r.json"
    res = run([*DDP, "preflight", "--timeout", "20", "--report", str(report)], clean_env(), str(tmp_path))
    assert res.rc == 0, res.output
    assert ("PASS" in res.stdout or "WARN" in res.stdout) and str(report) in res.stdout
    rep = load_json(str(report))
    assert_healthy(rep)
    assert rep["schema"] == "ddp-doctor.report" and rep["schema_version"] == 1
    assert rep["world"]["world_size"] == 2 and rep["world"]["backend"] == "gloo"
    assert [r["rank"] for r in rep["ranks"]] == [0, 1]
    ar = rep["measurements"]["all_reduce"]
    assert ar and all(m["correct"] for m in ar)
    assert_clean_output(res)


def test_under_torchrun_json_and_report(tmp_path):
    report = tmp_path / "r.json"
    res = run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "ddp_doctor", "preflight",
               "--timeout", "20", "--report", str(report), "--json"], clean_env(), str(tmp_path))
    assert res.rc == 0, res.output
    printed = json.loads(res.stdout)  # only rank 0 prints, and only the JSON document
    assert printed["world"]["launcher"] == "torchrun"
    assert_healthy(printed)
    assert load_json(str(report))["status"] == printed["status"]


def test_world_size_larger_than_launched_names_missing_rank(tmp_path):
    report = tmp_path / "r.json"
    res = run_ranks(2, ["preflight", "--timeout", "3", "--report", str(report)], clean_env(),
                    str(tmp_path), world_size=3)
    assert all(r.rc == 3 for r in res.values()), {r: x.output for r, x in res.items()}
    assert all(r.seconds < 30 for r in res.values())
    rep = load_json(str(report))
    missing = [f for f in rep["findings"] if f["id"] == "DDP320"]
    assert missing and missing[0]["ranks"] == [2] and "missing 2" in missing[0]["message"]
    assert rep["root_cause"]["id"] == "DDP320"
    for r in res.values():
        assert_clean_output(r)


def test_master_refusing_is_diagnosed_within_bound(tmp_path):
    report = tmp_path / "r.json"
    res = run_ranks(2, ["preflight", "--timeout", "2", "--report", str(report)], clean_env(),
                    str(tmp_path), ranks=[1])
    r1 = res[1]
    assert r1.rc == 3 and r1.seconds < 20, r1.output
    own = load_json(str(report) + ".rank1.json")
    assert "DDP311" in ids(own, "error")
    assert load_json(str(report))["status"] == "fail"  # PATH exists in every outcome
    assert_clean_output(r1)


def test_unresolvable_master(tmp_path):
    report = tmp_path / "r.json"
    env = clean_env(MASTER_ADDR="no-such-master.invalid")
    res = run_ranks(2, ["preflight", "--timeout", "2", "--report", str(report)], env, str(tmp_path),
                    ranks=[1])
    assert res[1].rc == 3
    assert "DDP310" in ids(load_json(str(report) + ".rank1.json"))
    assert_clean_output(res[1])


def test_port_already_in_use(tmp_path):
    report = tmp_path / "r.json"
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        res = run_ranks(1, ["preflight", "--timeout", "2", "--report", str(report)], clean_env(),
                        str(tmp_path), world_size=2, port=port, ranks=[0])
    finally:
        holder.close()
    assert res[0].rc == 3
    rep = load_json(str(report))
    assert rep["root_cause"]["id"] == "DDP313" and str(port) in rep["root_cause"]["message"]


def test_missing_master_addr_multi_node_layout(tmp_path):
    # RANK/WORLD_SIZE set by hand for 2 nodes of 1 process, but no MASTER_ADDR at all.
    env = clean_env()
    report = tmp_path / "r.json"
    res = run([*DDP, "preflight", "--timeout", "2", "--report", str(report)],
              {**env, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
              str(tmp_path))
    assert res.rc == 3, res.output
    own = load_json(str(report) + ".rank1.json")
    assert any("MASTER_ADDR" in f["message"] for f in own["findings"] if f["severity"] == "error")
    assert_clean_output(res)


def test_sagemaker_env_with_more_gpus_than_visible(tmp_path):
    report = tmp_path / "r.json"
    env = clean_env(SM_HOSTS='["algo-1"]', SM_CURRENT_HOST="algo-1", SM_NUM_GPUS="8",
                    DDP_DOCTOR_SM_ROOT=str(tmp_path / "opt_ml"))
    res = run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "ddp_doctor", "preflight",
               "--timeout", "10", "--report", str(report)], env, str(tmp_path))
    assert res.rc != 0
    rep = load_json(str(report))
    assert rep["status"] == "fail"
    assert any("SM_NUM_GPUS" in f["message"] and "8" in f["message"] for f in rep["findings"])
    # the diagnosis reaches SageMaker's failure file, once
    failure = (tmp_path / "opt_ml" / "output" / "failure").read_text()
    assert failure.startswith("ddp-doctor") and len(failure) <= 1024


def test_malformed_sm_hosts_is_a_finding_not_a_traceback(tmp_path):
    report = tmp_path / "r.json"
    env = clean_env(SM_HOSTS="algo-1,algo-2", SM_CURRENT_HOST="algo-1",
                    DDP_DOCTOR_SM_ROOT=str(tmp_path / "opt_ml"))
    res = run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "ddp_doctor", "preflight",
               "--timeout", "10", "--report", str(report)], env, str(tmp_path))
    rep = load_json(str(report))
    assert any("SM_HOSTS" in f["message"] for f in rep["findings"] if f["severity"] == "error")
    assert rep["status"] == "fail"
    assert "SM_HOSTS" in res.stdout


def test_mismatched_env_between_ranks_is_named(tmp_path):
    report = tmp_path / "r.json"
    res = run_ranks(2, ["preflight", "--timeout", "10", "--report", str(report)], clean_env(),
                    str(tmp_path), per_rank={1: {"NCCL_ALGO": "Tree"}})
    assert res[0].rc in (0, 3), res[0].output
    rep = load_json(str(report))
    env_findings = [f for f in rep["findings"] if f["category"] == "consistency" and "NCCL_ALGO" in f["message"]]
    assert env_findings and 1 in env_findings[0]["ranks"]


def test_crashing_check_becomes_internal_finding(tmp_path):
    report = tmp_path / "r.json"
    env = clean_env(DDP_DOCTOR_CHECK_MODULES="tests.plugins.crashing_check",
                    PYTHONPATH=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    res = run([*DDP, "preflight", "--timeout", "20", "--report", str(report)], env, str(tmp_path))
    rep = load_json(str(report))
    crashed = [f for f in rep["findings"] if f["id"] == "DDP001"]
    assert crashed and "boom from a test check" in crashed[0]["message"] and crashed[0]["ranks"] == [0, 1]
    assert rep["measurements"]["all_reduce"], "the other checks still ran"
    assert res.rc == 3
    assert_clean_output(res)


def test_planted_aws_secret_appears_in_no_output(tmp_path):
    report = tmp_path / "r.json"
    env = clean_env(AWS_SECRET_ACCESS_KEY=SECRET, AWS_ACCESS_KEY_ID="AKIAIOSFODNN7EXAMPLE",
                    NCCL_DEBUG_SECRET_TOKEN=SECRET, SM_HOSTS='["algo-1"]', SM_CURRENT_HOST="algo-1",
                    DDP_DOCTOR_SM_ROOT=str(tmp_path / "opt_ml"))
    res = run([*DDP, "preflight", "--timeout", "20", "--report", str(report), "--verbose"], env, str(tmp_path))
    res_env = run([*DDP, "env"], env, str(tmp_path))
    for text in (res.output, res_env.output, report.read_text()):
        assert SECRET not in text
    assert "AWS_SECRET_ACCESS_KEY" in res_env.stdout


def test_two_nodes_simulated_with_two_torchrun_invocations(tmp_path):
    from helpers.nodes import run_nodes
    report = tmp_path / "r.json"
    results = run_nodes(tmp_path, ["algo-1", "algo-2"],
                        ["preflight", "--timeout", "20", "--report", str(report)])
    assert all(r.rc == 0 for r in results), [r.output for r in results]
    rep = load_json(str(report))
    assert_healthy(rep)
    assert rep["world"]["nnodes"] == 2 and rep["world"]["world_size"] == 2
    assert sorted((r["node_rank"], r["host"]) for r in rep["ranks"]) == [(0, "algo-1"), (1, "algo-2")]


def test_under_mpirun(tmp_path):
    import shutil
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed (.ci/run installs Debian's openmpi-bin)")
    report = tmp_path / "r.json"
    env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    res = run(["mpirun", "-np", "2", "--oversubscribe", *DDP, "preflight", "--timeout", "20",
               "--report", str(report)], env, str(tmp_path))
    assert res.rc == 0, res.output
    rep = load_json(str(report))
    assert rep["world"]["launcher"] == "mpirun" and rep["world"]["world_size"] == 2
    assert [r["rank"] for r in rep["ranks"]] == [0, 1]
    assert rep["measurements"]["all_reduce"][-1]["correct"]
    # no MASTER_ADDR under a single-node mpirun: the default is used and said so, as info
    assert "DDP104" in ids(rep, "info")


@pytest.mark.parametrize("launcher,make_env", [
    ("slurm", lambda r, n: {"SLURM_PROCID": str(r), "SLURM_LOCALID": str(r), "SLURM_NTASKS": str(n),
                            "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_STEP_ID": "0",
                            "SLURM_STEP_TASKS_PER_NODE": str(n), "SLURM_JOB_ID": "42"}),
    ("mpich", lambda r, n: {"PMI_RANK": str(r), "PMI_SIZE": str(n), "MPI_LOCALRANKID": str(r),
                            "MPI_LOCALNRANKS": str(n)}),
])
def test_under_slurm_and_mpich_style_launchers(tmp_path, launcher, make_env):
    """The variables srun and MPICH's hydra set, given to two real processes by hand."""
    from helpers.procs import finish, start
    report = tmp_path / "r.json"
    port = free_port()
    procs = [start([*DDP, "preflight", "--timeout", "20", "--report", str(report)],
                   clean_env(MASTER_PORT=str(port), **make_env(r, 2)), str(tmp_path)) for r in range(2)]
    results = [finish(p, 120) for p in procs]
    assert all(r.rc == 0 for r in results), [r.output for r in results]
    rep = load_json(str(report))
    assert rep["world"]["launcher"] == launcher and rep["world"]["world_size"] == 2
    assert [r["rank"] for r in rep["ranks"]] == [0, 1]


def test_internal_failure_still_writes_a_report_and_exits_1(tmp_path):
    report = tmp_path / "r.json"
    env = clean_env(DDP_DOCTOR_CHECK_MODULES="tests.plugins.breaks_views",
                    PYTHONPATH=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    res = run_ranks(1, ["preflight", "--timeout", "5", "--report", str(report)], env, str(tmp_path))
    assert res[0].rc == 1, res[0].output
    rep = load_json(str(report))
    assert rep["root_cause"]["id"] == "DDP005"
    assert "simulated failure inside ddp-doctor" in rep["root_cause"]["message"]
    assert_clean_output(res[0])
