"""End-to-end preflight on real processes: torchrun launches, hand-started ranks, real gloo groups.

The launches are started together by one module fixture, a few at a time, and each test reads its
own launch's result. Processes that must meet (ranks of one world started by hand, two simulated
nodes) are one job of the queue, started together. No assertion here depends on how long a launch
took: a bound a failure is diagnosed within is read from the report (the bound it was given, the
time it waited at least).
"""
from __future__ import annotations

import json
import shutil
import socket
import sys
from pathlib import Path

import pytest
from helpers.procs import (
    DDP,
    NO_SWEEP,
    Launch,
    Result,
    assert_clean_output,
    assert_healthy,
    clean_env,
    finish,
    free_port,
    ids,
    load_json,
    outputs,
    result_of,
    run_all,
    run_ranks,
    start,
)

pytestmark = pytest.mark.slow
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
ROOT = str(Path(__file__).resolve().parents[2])
AT_ONCE = 3  # launches at a time on 2 cores
NODES = ["algo-1", "algo-2"]
# NO_SWEEP: the launches whose subject is the environment or the launcher; the CPU default,
# torchrun, mpirun, two nodes and the crashing check keep the sweep
SLURM_MPICH = {
    "slurm": lambda r, n: {"SLURM_PROCID": str(r), "SLURM_LOCALID": str(r), "SLURM_NTASKS": str(n),
                           "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_STEP_ID": "0",
                           "SLURM_STEP_TASKS_PER_NODE": str(n), "SLURM_JOB_ID": "42"},
    "mpich": lambda r, n: {"PMI_RANK": str(r), "PMI_SIZE": str(n), "MPI_LOCALRANKID": str(r),
                           "MPI_LOCALNRANKS": str(n)},
}


class Runs:
    """The fixture's launches: each test's directory and its launch's result (or exception)."""

    def __init__(self, base: Path):
        self.base = base
        self.done: dict = {}

    def dir(self, name: str) -> Path:
        return self.base / name

    def report(self, name: str) -> Path:
        return self.base / name / "r.json"

    def result(self, name: str):
        return result_of(self.done, name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runs = Runs(tmp_path_factory.mktemp("preflight"))
    names = ["self_launch", "torchrun", "unresolvable", "port_in_use", "missing_master", "sm_gpus", "sm_hosts",
             "mismatched_env", "crashing_check", "secret_env", "two_nodes", "mpirun", "slurm", "mpich", "internal",
             "late_init", "init_fails", "larger_world", "plans", "refused"]
    for name in names:
        runs.dir(name).mkdir()

    def preflight(name: str, timeout: str, *more: str) -> list[str]:
        return ["preflight", "--timeout", timeout, "--report", str(runs.report(name)), *more]

    def temp_dir(name: str) -> Path:
        (runs.dir(name) / "tmp").mkdir()
        return runs.dir(name) / "tmp"

    def single(name: str, cmd: list[str], env: dict) -> Launch:
        return Launch(cmd, env, str(runs.dir(name)))

    def ranks(name: str, n: int, timeout: str, env: dict, more: tuple[str, ...] = (), **kw):
        """Ranks started by hand (helpers.procs.run_ranks), together, when the queue gets to them."""
        return lambda: run_ranks(n, preflight(name, timeout, *more), env, str(runs.dir(name)), **kw)

    def by_hand(name: str, make_env):
        """The variables srun and MPICH's hydra set, given to two real processes by hand."""
        def go() -> list[Result]:
            port = free_port()
            env = [clean_env(MASTER_PORT=str(port), **make_env(r, 2)) for r in range(2)]
            procs = [start([*DDP, *preflight(name, "20", *NO_SWEEP)], env[r], str(runs.dir(name))) for r in range(2)]
            return [finish(p, 120) for p in procs]
        return go

    def two_nodes() -> list[Result]:
        from helpers.nodes import run_nodes
        return run_nodes(runs.dir("two_nodes"), NODES, preflight("two_nodes", "20"))

    # the planted secrets ride on the SageMaker preflight (its output, report and failure file) and
    # on `ddp-doctor env`, with the same SageMaker variables
    def secret_env(name: str, **more: str) -> dict:
        return clean_env(AWS_SECRET_ACCESS_KEY=SECRET, AWS_ACCESS_KEY_ID="AKIAIOSFODNN7EXAMPLE",
                         NCCL_DEBUG_SECRET_TOKEN=SECRET, SM_HOSTS='["algo-1"]', SM_CURRENT_HOST="algo-1",
                         DDP_DOCTOR_SM_ROOT=str(runs.dir(name) / "opt_ml"), **more)
    jobs: dict = {  # the longer first, so that the queue ends with short ones
        "two_nodes": two_nodes,
        "crashing_check": single("crashing_check", [*DDP, *preflight("crashing_check", "20")],
                                 clean_env(DDP_DOCTOR_CHECK_MODULES="tests.plugins.crashing_check", PYTHONPATH=ROOT)),
        "late_init": single("late_init", [*DDP, *preflight("late_init", "20", "--skip", "communication")],
                            clean_env(DDP_DOCTOR_CHECK_MODULES="tests.plugins.late_init_return", PYTHONPATH=ROOT,
                                      LATE_INIT_LOG=str(runs.dir("late_init") / "order.log"))),
        "init_fails": single("init_fails", [*DDP, *preflight("init_fails", "20")],
                             clean_env(DDP_DOCTOR_CHECK_MODULES="tests.plugins.init_fails_on_one_rank",
                                       PYTHONPATH=ROOT)),
        "sm_gpus": single("sm_gpus", [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "ddp_doctor",
                                      *preflight("sm_gpus", "10", "--verbose", *NO_SWEEP)],
                          secret_env("sm_gpus", SM_NUM_GPUS="8")),
        "sm_hosts": single("sm_hosts", [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "ddp_doctor",
                                        *preflight("sm_hosts", "10", *NO_SWEEP)],
                           clean_env(SM_HOSTS="algo-1,algo-2", SM_CURRENT_HOST="algo-1",
                                     DDP_DOCTOR_SM_ROOT=str(runs.dir("sm_hosts") / "opt_ml"))),
        "torchrun": single("torchrun", [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "ddp_doctor",
                                        *preflight("torchrun", "20", "--json")], clean_env()),
        "self_launch": single("self_launch", [*DDP, *preflight("self_launch", "20")],
                              clean_env(TMPDIR=str(temp_dir("self_launch")))),
        "plans": ranks("plans", 2, "60", clean_env(), args_of={0: ["--select", "DDP407"], 1: ["--select", "DDP402"]}),
        "mismatched_env": ranks("mismatched_env", 2, "10", clean_env(), more=NO_SWEEP,
                                per_rank={1: {"NCCL_ALGO": "Tree"}}),
        **{launcher: by_hand(launcher, make_env) for launcher, make_env in SLURM_MPICH.items()},
    }
    if shutil.which("mpirun") is not None:
        jobs["mpirun"] = single("mpirun", ["mpirun", "-np", "2", "--oversubscribe", *DDP, *preflight("mpirun", "20")],
                                clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))
    jobs.update({
        "unresolvable": ranks("unresolvable", 2, "2", clean_env(MASTER_ADDR="no-such-master.invalid"), ranks=[1]),
        "missing_master": single("missing_master", [*DDP, *preflight("missing_master", "2")],
                                 {**clean_env(), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                                  "LOCAL_WORLD_SIZE": "1"}),
        "secret_env": single("secret_env", [*DDP, "env"], secret_env("secret_env")),
        "larger_world": ranks("larger_world", 2, "3", clean_env(), world_size=3),
        "internal": ranks("internal", 1, "5", clean_env(DDP_DOCTOR_CHECK_MODULES="tests.plugins.breaks_views",
                                                       PYTHONPATH=ROOT)),
    })
    holder = socket.socket()  # a port in use while the launches run
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    runs.held_port = holder.getsockname()[1]
    jobs["port_in_use"] = ranks("port_in_use", 1, "2", clean_env(), world_size=2, port=runs.held_port, ranks=[0])
    # a port bound and never listened on: a connection to it is refused, and no other launch of the
    # queue can be given it meanwhile
    closed = socket.socket()
    closed.bind(("0.0.0.0", 0))
    jobs["refused"] = ranks("refused", 2, "2", clean_env(), port=closed.getsockname()[1], ranks=[1])
    try:
        runs.done = run_all(jobs, at_once=AT_ONCE)
    finally:
        holder.close()
        closed.close()
    return runs


def test_self_launch_cpu_default_passes(runs):
    report = runs.report("self_launch")
    res = runs.result("self_launch")
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
    # its temp directory (TMPDIR) as it was: torch's launcher made its log tree in the launch
    # directory, removed with it, not a /tmp/torchelastic_* of its own that would stay
    assert sorted(p.name for p in (runs.dir("self_launch") / "tmp").iterdir()) == [], "left in TMPDIR"


def test_under_torchrun_json_and_report(runs):
    report = runs.report("torchrun")
    res = runs.result("torchrun")
    assert res.rc == 0, res.output
    printed = json.loads(res.stdout)  # only rank 0 prints, and only the JSON document
    assert printed["world"]["launcher"] == "torchrun"
    assert_healthy(printed)
    assert load_json(str(report))["status"] == printed["status"]


def test_world_size_larger_than_launched_names_missing_rank(runs):
    report = runs.report("larger_world")
    res = runs.result("larger_world")  # ranks 0 and 1 of 3
    assert all(r.rc == 3 for r in res.values()), outputs(res)
    rep = load_json(str(report))
    missing = [f for f in rep["findings"] if f["id"] == "DDP320"]
    assert missing and missing[0]["ranks"] == [2] and "missing 2" in missing[0]["message"]
    # the meeting ended by the --timeout bound it was given (run_ranks fails the test on an overrun)
    assert missing[0]["evidence"]["timeout_s"] == 3.0 and "within 3 s" in missing[0]["message"]
    assert rep["root_cause"]["id"] == "DDP320"
    for r in res.values():
        assert_clean_output(r)


def test_ranks_that_would_run_different_group_checks_run_none_and_say_so(runs):
    # as a node with another ddp-doctor version, or given another --select, would
    report = runs.report("plans")
    res = runs.result("plans")  # rank 0 with --select DDP407, rank 1 with --select DDP402
    assert all(r.rc == 3 for r in res.values()), outputs(res)
    rep = load_json(str(report))
    assert rep["root_cause"]["id"] == "DDP326" and rep["root_cause"]["ranks"] == [0, 1], rep["findings"]
    (f,) = [f for f in rep["findings"] if f["id"] == "DDP326"]
    assert "2 plans: rank(s) 0; rank(s) 1" in f["message"], f["message"]
    plans = {k: v["plan"] for k, v in f["evidence"]["per_rank"].items()}
    assert sorted(plans.values()) == [["DDP402"], ["DDP407"]], f["evidence"]
    # no check waited for a collective its peer never called (that read as a crashed or stuck check)
    assert not ids(rep) & {"DDP001", "DDP002"}, rep["findings"]
    for r in res.values():
        assert_clean_output(r)


def test_master_refusing_is_diagnosed_within_bound(runs):
    report = runs.report("refused")
    res = runs.result("refused")  # rank 1 of 2, at a port nobody listens on
    r1 = res[1]
    assert r1.rc == 3, r1.output
    own = load_json(str(report) + ".rank1.json")
    assert "DDP311" in ids(own, "error")
    refused = next(f for f in own["findings"] if f["id"] == "DDP311")
    # refused for the whole --timeout bound, then diagnosed (run_ranks fails the test on an overrun)
    assert refused["evidence"]["bound_s"] == 2.0 and refused["evidence"]["elapsed_s"] >= 2.0, refused
    assert load_json(str(report))["status"] == "fail"  # PATH exists in every outcome
    assert_clean_output(r1)


def test_unresolvable_master(runs):
    report = runs.report("unresolvable")
    res = runs.result("unresolvable")  # rank 1 of 2, MASTER_ADDR=no-such-master.invalid
    assert res[1].rc == 3
    assert "DDP310" in ids(load_json(str(report) + ".rank1.json"))
    assert_clean_output(res[1])


def test_port_already_in_use(runs):
    report = runs.report("port_in_use")
    port = runs.held_port  # held open by the fixture while rank 0 of 2 tried to serve on it
    res = runs.result("port_in_use")
    assert res[0].rc == 3
    rep = load_json(str(report))
    assert rep["root_cause"]["id"] == "DDP313" and str(port) in rep["root_cause"]["message"]


def test_missing_master_addr_multi_node_layout(runs):
    # RANK/WORLD_SIZE set by hand for 2 nodes of 1 process, but no MASTER_ADDR at all.
    report = runs.report("missing_master")
    res = runs.result("missing_master")
    assert res.rc == 3, res.output
    own = load_json(str(report) + ".rank1.json")
    assert any("MASTER_ADDR" in f["message"] for f in own["findings"] if f["severity"] == "error")
    assert_clean_output(res)


def test_sagemaker_env_with_more_gpus_than_visible(runs):
    tmp_path = runs.dir("sm_gpus")
    report = runs.report("sm_gpus")
    res = runs.result("sm_gpus")
    assert res.rc != 0
    rep = load_json(str(report))
    assert rep["status"] == "fail"
    assert any("SM_NUM_GPUS" in f["message"] and "8" in f["message"] for f in rep["findings"])
    # the diagnosis reaches SageMaker's failure file, once
    failure = (tmp_path / "opt_ml" / "output" / "failure").read_text()
    assert failure.startswith("ddp-doctor") and len(failure) <= 1024


def test_malformed_sm_hosts_is_a_finding_not_a_traceback(runs):
    report = runs.report("sm_hosts")
    res = runs.result("sm_hosts")
    rep = load_json(str(report))
    assert any("SM_HOSTS" in f["message"] for f in rep["findings"] if f["severity"] == "error")
    assert rep["status"] == "fail"
    assert "SM_HOSTS" in res.stdout


def test_mismatched_env_between_ranks_is_named(runs):
    report = runs.report("mismatched_env")
    res = runs.result("mismatched_env")  # rank 1 with NCCL_ALGO=Tree
    assert res[0].rc in (0, 3), res[0].output
    rep = load_json(str(report))
    env_findings = [f for f in rep["findings"] if f["category"] == "consistency" and "NCCL_ALGO" in f["message"]]
    assert env_findings and 1 in env_findings[0]["ranks"]


def test_no_rank_destroys_the_group_before_every_rank_returned_from_init(runs):
    """torch's init_process_group has no barrier at its end: with no collective to run (`--skip
    communication`) a rank that destroyed its group at once closed the connections under a peer
    whose init had not yet returned, and that peer's init failed (a false DDP321 on a loaded
    host). Rank 1 here returns 3 s late from init: rank 0 destroys only after it returned."""
    res = runs.result("late_init")
    assert res.rc == 0, res.output
    events = {}
    for line in (runs.dir("late_init") / "order.log").read_text().splitlines():
        what, rank, at = line.split()
        events.setdefault((what, int(rank)), float(at))
    assert set(events) == {("init", 0), ("init", 1), ("destroy", 0), ("destroy", 1)}, events
    assert events[("destroy", 0)] >= events[("init", 1)], events


def test_no_collective_waits_for_a_rank_whose_init_failed(runs):
    """Rank 1's init fails after rank 0's returned (NCCL's init is lazy: a rank whose GPU does not
    exist fails, its peers' returned). Rank 0 runs no collective that would wait for rank 1: the
    verdict is rank 1's DDP321 alone, no collective timed out, no sweep was measured."""
    res = runs.result("init_fails")
    rep = load_json(str(runs.report("init_fails")))
    assert res.rc == 3, res.output
    errors = [(f["id"], f["ranks"]) for f in rep["findings"] if f["severity"] == "error"]
    assert errors == [("DDP321", [1])], errors
    assert "invalid device ordinal" in rep["root_cause"]["message"]
    stages = rep["measurements"]["stage_seconds"]
    assert "group_ready" in stages and "group_checks" not in stages, stages
    assert "all_reduce" not in rep["measurements"]


def test_crashing_check_becomes_internal_finding(runs):
    report = runs.report("crashing_check")
    res = runs.result("crashing_check")
    rep = load_json(str(report))
    crashed = [f for f in rep["findings"] if f["id"] == "DDP001"]
    assert crashed and "boom from a test check" in crashed[0]["message"] and crashed[0]["ranks"] == [0, 1]
    assert rep["measurements"]["all_reduce"], "the other checks still ran"
    assert res.rc == 3
    assert_clean_output(res)


def test_planted_aws_secret_appears_in_no_output(runs):
    report = runs.report("sm_gpus")  # a failing SageMaker preflight, --verbose, secrets in its environment
    res = runs.result("sm_gpus")
    res_env = runs.result("secret_env")
    failure = runs.dir("sm_gpus") / "opt_ml" / "output" / "failure"
    for text in (res.output, res_env.output, report.read_text(), failure.read_text()):
        assert SECRET not in text
    assert "AWS_SECRET_ACCESS_KEY" in res_env.stdout


def test_two_nodes_simulated_with_two_torchrun_invocations(runs):
    from helpers.nodes import require_namespaces
    require_namespaces()
    report = runs.report("two_nodes")
    results = runs.result("two_nodes")
    assert all(r.rc == 0 for r in results), outputs(results)
    rep = load_json(str(report))
    assert_healthy(rep)
    assert rep["world"]["nnodes"] == 2 and rep["world"]["world_size"] == 2
    assert sorted((r["node_rank"], r["host"]) for r in rep["ranks"]) == [(0, "algo-1"), (1, "algo-2")]


def test_under_mpirun(runs):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed (.ci/run installs Debian's openmpi-bin)")
    report = runs.report("mpirun")
    res = runs.result("mpirun")
    assert res.rc == 0, res.output
    rep = load_json(str(report))
    assert rep["world"]["launcher"] == "mpirun" and rep["world"]["world_size"] == 2
    assert [r["rank"] for r in rep["ranks"]] == [0, 1]
    assert rep["measurements"]["all_reduce"][-1]["correct"]
    # no MASTER_ADDR under a single-node mpirun: the default is used and said so, as info
    assert "DDP104" in ids(rep, "info")


@pytest.mark.parametrize("launcher,make_env", list(SLURM_MPICH.items()))
def test_under_slurm_and_mpich_style_launchers(runs, launcher, make_env):
    """The variables srun and MPICH's hydra set (make_env), given to two real processes by hand."""
    report = runs.report(launcher)
    results = runs.result(launcher)
    assert all(r.rc == 0 for r in results), outputs(results)
    rep = load_json(str(report))
    assert rep["world"]["launcher"] == launcher and rep["world"]["world_size"] == 2
    assert [r["rank"] for r in rep["ranks"]] == [0, 1]


def test_internal_failure_still_writes_a_report_and_exits_1(runs):
    report = runs.report("internal")
    res = runs.result("internal")  # rank 0 of 1, started by hand
    assert res[0].rc == 1, res[0].output
    rep = load_json(str(report))
    assert rep["root_cause"]["id"] == "DDP005"
    assert "simulated failure inside ddp-doctor" in rep["root_cause"]["message"]
    assert_clean_output(res[0])
