"""Kubernetes local checks (DDP220-DDP222) in the pods Kubeflow's operators make (PyTorchJob and
TrainJob, ddp_doctor.testing.kubeflow_pod_env): a failing and a passing case each, the pod's view
(facts/kubernetes.py) and torchrun_pod, which decides whether `run` launches or is a rank."""
from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from helpers.context import make_ctx, torchrun_env
from helpers.procs import DDP, NO_SWEEP, clean_env

from ddp_doctor.check_runner import run_stage
from ddp_doctor.facts import kubernetes
from ddp_doctor.facts.launchers import torchrun_pod
from ddp_doctor.findings import Finding
from ddp_doctor.testing import kubeflow_pod_env

IDS = ("DDP220", "DDP221", "DDP222")


def found(env: dict[str, str]) -> list[Finding]:
    ctx = make_ctx(env)
    out = run_stage("local", (ctx,), rank=ctx.rank, select=list(IDS))
    assert not [f for f in out if f.id in ("DDP001", "DDP002")], [f.message for f in out]
    return [f for f in out if f.id in IDS]


def rank_of(pod: dict[str, str], *, local_rank: int = 0, per_pod: int = 2, nodes: int = 2, node: int | None = None,
            master: str | None = None, **kw: Any) -> dict[str, str]:
    """A rank torchrun started in that pod: the pod's variables, then torchrun's for its workers."""
    node = int(pod["PET_NODE_RANK"]) if node is None else node
    addr = master or pod.get("PET_MASTER_ADDR", "127.0.0.1")
    return {**pod, **torchrun_env(rank=node * per_pod + local_rank, local_rank=local_rank, world_size=nodes * per_pod,
                                  local_world_size=per_pod, group_rank=node, nnodes=nodes, master_addr=addr, **kw)}


@pytest.mark.parametrize("operator", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("index", [0, 1])
def test_a_launch_that_follows_the_operator_passes(operator, index):
    assert found(rank_of(kubeflow_pod_env(operator, index=index))) == []


def test_outside_kubernetes_nothing_is_said():
    env = rank_of(kubeflow_pod_env("pytorchjob", index=1), nodes=1, node=0, master="localhost")
    del env["KUBERNETES_SERVICE_HOST"]
    assert found(env) == []


@pytest.mark.parametrize("operator", ["pytorchjob", "trainjob"])
def test_a_command_with_nnodes_1_makes_each_pod_a_job_of_its_own(operator):
    # `torchrun --nnodes 1 --nproc-per-node 2 train.py` in a two-pod job: WORLD_SIZE 2, not 4
    [f] = found(rank_of(kubeflow_pod_env(operator, index=0), nodes=1, node=0, master="127.0.0.1"))
    assert f.id == "DDP220" and f.severity == "error"
    assert "WORLD_SIZE=2 but the" in f.message and "2 pod(s) (PET_NNODES) x 2 process(es) per pod" in f.message
    assert "each pod forms a job of its own" in f.message and "torchrun train.py" in f.hint


def test_one_process_per_pod_where_world_size_counts_two_waits_at_the_rendezvous():
    env = kubeflow_pod_env("pytorchjob", index=1)  # `python train.py`: RANK and WORLD_SIZE are the pod's
    [f] = found(env)
    assert f.id == "DDP220" and "this pod runs one process" in f.message and "WORLD_SIZE=4" in f.message
    # nprocPerNode "auto": WORLD_SIZE counts the pods, one process per pod is the job's layout
    assert found(kubeflow_pod_env("pytorchjob", index=1, nproc_per_node="auto")) == []


@pytest.mark.parametrize("operator, source", [("pytorchjob", "the pod name train-worker-0"),
                                              ("trainjob", "JOB_COMPLETION_INDEX")])
def test_a_node_rank_written_into_the_command_is_named(operator, source):
    # `--node-rank 0` in every pod: pod 1 claims node 0 too
    [f] = found(rank_of(kubeflow_pod_env(operator, index=1), node=0))
    assert f.id == "DDP221" and "node 0 (GROUP_RANK) but it is node 1" in f.message and source in f.message


@pytest.mark.parametrize("operator, expected", [("pytorchjob", "train-master-0"),
                                                ("trainjob", "train-node-0-0.train")])
def test_a_master_address_of_its_own_on_a_worker_pod_is_named(operator, expected):
    [f] = found(rank_of(kubeflow_pod_env(operator, index=1), master="localhost"))
    assert f.id == "DDP222" and "MASTER_ADDR=localhost on pod" in f.message and expected in f.message
    assert "wait for a master of their own" in f.message
    # the service's longer names are the same master; the master pod itself may name itself
    assert found(rank_of(kubeflow_pod_env(operator, index=1), master=expected + ".default.svc.cluster.local")) == []
    assert found(rank_of(kubeflow_pod_env(operator, index=0), master="localhost")) == []


def test_an_elastic_job_gives_node_ranks_and_master_by_its_rendezvous():
    pod = {**kubeflow_pod_env("pytorchjob", index=1), "PET_RDZV_BACKEND": "c10d",
           "PET_RDZV_ENDPOINT": "train-worker-0:23456", "PET_NNODES": "1:4"}
    assert found(rank_of(pod, node=0, master="10.0.0.9")) == []


def test_the_pods_view():
    pod = kubernetes.read(kubeflow_pod_env("pytorchjob", index=2, pods=3))
    assert pod is not None and (pod.operator, pod.job, pod.index, pod.nnodes) == ("pytorchjob", "train", 2, 3)
    assert pod.expected_master == "train-master-0"
    pod = kubernetes.read(kubeflow_pod_env("trainjob", job="llm", index=3, pods=4))
    assert pod is not None and (pod.operator, pod.job, pod.index) == ("trainjob", "llm", 3)
    assert pod.expected_master == "llm-node-0-0.llm"
    assert kubernetes.read({"HOSTNAME": "train-master-0"}) is None  # not in a pod
    plain = kubernetes.read({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOSTNAME": "web-5d8f"})
    assert plain is not None and plain.operator == ""


@pytest.mark.parametrize("operator, nproc, launches", [("pytorchjob", "2", True), ("trainjob", "2", True),
                                                        ("trainjob", "auto", True), ("pytorchjob", "auto", False)])
def test_run_launches_where_torchrun_would(operator, nproc, launches):
    assert torchrun_pod(kubeflow_pod_env(operator, index=1, nproc_per_node=nproc)) is launches


@pytest.mark.slow
def test_run_in_a_pod_whose_command_sets_its_own_layout_stops_before_training(tmp_path):
    # the master pod of a two-pod PyTorchJob whose command says --nnodes 1: its two ranks would
    # train alone, as would the other pod's; the preflight says so and the script never starts
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    pod = {**kubeflow_pod_env("pytorchjob", pods=2, nproc_per_node="2"), "MASTER_ADDR": "127.0.0.1",
           "PET_MASTER_ADDR": "127.0.0.1"}
    res = subprocess.run([*DDP, "run", "--nnodes", "1", *NO_SWEEP, "--report", str(tmp_path / "r.json"), str(script)],
                         env=clean_env(**pod), cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert res.returncode == 3, res.stderr[-3000:]
    assert "trained" not in res.stdout
    cause = json.loads((tmp_path / "r.json").read_text())["root_cause"]
    assert cause["id"] == "DDP220" and cause["ranks"] == [0, 1], cause
    assert (cause["cause_class"], cause["action"]) == ("configuration", "fix_configuration")
    assert "each pod forms a job of its own" in res.stderr


def test_preflight_in_a_pod_starts_the_launcher_as_the_pods_torchrun_would():
    from ddp_doctor.preflight_ranks.local_launch import launcher_command, pod_layout
    pod = kubeflow_pod_env("trainjob", index=1, pods=2, nproc_per_node="2")
    layout = pod_layout(pod, None, 30.0)
    cmd = launcher_command(layout, ["preflight"])
    # the layout is torchrun's to read from PET_*: no --standalone, --nnodes, --node-rank or master here
    assert not {"--standalone", "--nnodes", "--node-rank", "--master-addr", "--master-port"} & set(cmd)
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2" and "--rdzv-conf=timeout=30,join_timeout=30" in cmd
    assert layout.expected == [2, 3] and (layout.world["world_size"], layout.world["nnodes"]) == (4, 2)
    # the user's own rendezvous settings stand; one pod waits for nobody; --nproc-per-node wins
    own = pod_layout({**pod, "PET_RDZV_CONF": "timeout=99"}, None, 30.0)
    assert own.options == ("--rdzv-conf=timeout=99,join_timeout=30",)
    one = pod_layout(kubeflow_pod_env("trainjob", pods=1, nproc_per_node="auto"), 3, 30.0)
    assert (one.options, one.nproc, one.expected) == ((), 3, [0, 1, 2])


def test_a_pod_without_the_reporting_rank_shows_the_jobs_root_cause(tmp_path):
    from ddp_doctor.processes.launch_dir import merge_launch_dir, rank_path
    cause = {"id": "DDP322", "category": "rendezvous", "severity": "error", "title": "t", "message": "rank 0 on pod 0",
             "hint": "h", "ranks": [0], "evidence": {}}
    for r in (2, 3):
        with open(rank_path(str(tmp_path), r), "w") as f:
            json.dump({"rank": r, "final": True, "view": None, "findings": [],
                       "verdict": {"status": "fail", "root_cause": cause}}, f)
    world = {"launcher": "torchrun", "world_size": 4, "nnodes": 2, "nproc_per_node": 2}
    rep = merge_launch_dir(str(tmp_path), 2, 3, False, 100.0, expected=[2, 3], world=world)
    assert rep["status"] == "fail" and rep["root_cause"]["id"] == "DDP322" and rep["root_cause"]["ranks"] == [0]
    assert rep["world"]["world_size"] == 4 and [f["id"] for f in rep["findings"]].count("DDP322") == 1


def _two_pods_preflight(tmp_path, pod0: dict[str, str] | None = None) -> list:
    """`ddp-doctor preflight` as the command of both pods of a TrainJob (simulated hosts), 1 process
    each; `pod0`: variables for pod 0 besides the operator's. Each pod's report in tmp_path/podN.json."""
    from helpers.nodes import on_node, require_namespaces
    from helpers.procs import finish, free_port, start
    require_namespaces()
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n127.0.0.1 train-node-0-0 train-node-0-0.train\n"
                     "127.0.0.2 train-node-0-1 train-node-0-1.train\n")
    port = free_port()
    procs = []
    for i in (0, 1):
        pod = {**kubeflow_pod_env("trainjob", index=i, pods=2, nproc_per_node="1", port=port),
               **((pod0 or {}) if i == 0 else {})}
        procs.append(start(on_node(pod["HOSTNAME"], hosts, [*DDP, "preflight", *NO_SWEEP, "--timeout", "8",
                                                              "--report", str(tmp_path / f"pod{i}.json")]),
                           clean_env(**pod), str(tmp_path)))
    return [finish(p, 150) for p in procs]


@pytest.mark.slow
def test_preflight_as_the_command_of_two_pods_spans_the_job(tmp_path):
    # one job of 2 pods x 1 process, met through the operator's PET_* variables: no layout finding
    for i, res in enumerate(_two_pods_preflight(tmp_path)):
        assert res.rc == 0, (i, res.stderr[-3000:])
        assert "2 rank(s) on 2 node(s)" in res.stdout + res.stderr, (i, res.stdout, res.stderr[-2000:])
    rep = json.loads((tmp_path / "pod0.json").read_text())
    assert rep["status"] in ("pass", "warn") and sorted(r["rank"] for r in rep["ranks"]) == [0, 1]
    assert {r["host"] for r in rep["ranks"]} == {"train-node-0-0", "train-node-0-1"}
    assert not {f["id"] for f in rep["findings"]} & set(IDS), rep["findings"]


@pytest.mark.slow
def test_the_pod_without_the_reporting_rank_shows_the_jobs_root_cause(tmp_path):
    # pod 0 names an interface it lacks: the job's root cause is rank 0's, and pod 1, whose own rank
    # only saw the group fail to form, says so too and exits by that verdict
    results = _two_pods_preflight(tmp_path, {"GLOO_SOCKET_IFNAME": "nonexistent0"})
    assert [r.rc for r in results] == [3, 3], [r.stderr[-2000:] for r in results]
    for i in (0, 1):
        rep = json.loads((tmp_path / f"pod{i}.json").read_text())
        assert rep["root_cause"]["id"] == "DDP301" and rep["root_cause"]["ranks"] == [0], (i, rep["findings"])
        assert (rep["world"]["world_size"], rep["world"]["nnodes"], rep["world"]["backend"]) == (2, 2, "gloo")
    assert "Root cause: DDP301 Named network interface does not exist [rank 0]" in results[1].stdout


@pytest.mark.slow
def test_a_pod_whose_peers_never_come_names_the_missing_pod_not_a_lost_rank(tmp_path):
    # pod 0 of 2 alone: torch's launcher in the pod waits for pod 1 (bounded by --timeout), starts no
    # rank and raises. The preflight says which node never joined, without torch's traceback,
    # where it said "ranks ended without a report" (DDP003) under that traceback
    from helpers.procs import finish, free_port, start
    pod = kubeflow_pod_env("trainjob", index=0, pods=2, nproc_per_node="2", port=free_port())
    report = tmp_path / "pod0.json"
    res = finish(start([*DDP, "preflight", *NO_SWEEP, "--timeout", "3", "--report", str(report)],
                       clean_env(**pod), str(tmp_path)), 120)
    assert res.rc == 3, res.output
    rep = json.loads(report.read_text())
    cause = rep["root_cause"]
    assert cause["id"] == "DDP320" and cause["ranks"] == [2, 3], rep["findings"]
    assert "node 1 never joined the launcher's rendezvous" in cause["message"]
    assert "no rank was started" in cause["message"]
    assert [f["id"] for f in rep["findings"] if f["severity"] == "error"] == ["DDP320"], rep["findings"]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
