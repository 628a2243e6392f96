"""SageMaker local checks (DDP201-DDP215): one failing and one passing case per check, a correct
2-host layout whose master is algo-2, and malformed input that must never crash a check."""
from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.context import make_ctx, mpirun_env, sm_env, torchrun_env, write_sm_config

from ddp_doctor.check_runner import run_stage
from ddp_doctor.checks import load_catalogue
from ddp_doctor.findings import Finding
from ddp_doctor.registry import parse_sections

SAGEMAKER_IDS = [f"DDP2{i:02d}" for i in range(1, 16)]
HOSTS = ["algo-1", "algo-2"]
# A real p4d layout (docs/facts.md): instance_groups list algo-2 first, so algo-2 is the master.
GROUPS_ALGO2_FIRST = [{"instance_group_name": "homogeneousCluster", "instance_type": "ml.p4d.24xlarge",
                       "hosts": ["algo-2", "algo-1"]}]
EFA_VARS = {"FI_PROVIDER": "efa", "NCCL_PROTO": "simple", "FI_EFA_USE_DEVICE_RDMA": "1"}


def run(ctx: Any, select: str) -> list[Finding]:
    found = run_stage("local", (ctx,), rank=ctx.rank, select=[select])
    assert not [f for f in found if f.id in ("DDP001", "DDP002")], [f.message for f in found]
    return [f for f in found if f.id.startswith(select)]


def one(ctx: Any, check_id: str) -> Finding:
    found = run(ctx, check_id)
    assert len(found) == 1, [f.message for f in found]
    return found[0]


def two_host_ctx(tmp_path: Any, *, host: str = "algo-1", group_rank: int | None = None, local_rank: int = 0,
                 master_addr: str = "algo-2", master_port: int = 7777, gpus: int = 8,
                 extra_env: dict[str, str] | None = None, **sm_kwargs: Any) -> Any:
    """A rank of the toolkit's torchrun launch on a 2-host p4d job whose master is algo-2."""
    root = write_sm_config(tmp_path, hosts=HOSTS, current_host=host, instance_groups=GROUPS_ALGO2_FIRST)
    node = ["algo-2", "algo-1"].index(host) if group_rank is None else group_rank
    env = {**sm_env(HOSTS, host, master="algo-2", **sm_kwargs),
           **torchrun_env(rank=node * 8 + local_rank, local_rank=local_rank, world_size=16, local_world_size=8,
                          group_rank=node, nnodes=2, master_addr=master_addr, master_port=master_port),
           "NCCL_SOCKET_IFNAME": "eth0", **EFA_VARS, **(extra_env or {})}
    return make_ctx(env, gpus=gpus, sm_root=root)


def test_catalogue_has_sagemaker_ids_with_docs() -> None:
    cat = load_catalogue()
    for cid in SAGEMAKER_IDS:
        entry = cat[cid]
        assert entry.category in ("topology", "launcher_env") and entry.stage == "local"
        sections = parse_sections(entry.doc)
        assert all(sections.get(s) for s in ("What", "Why", "Fix")), cid


def test_correct_two_host_layout_master_algo2_has_no_error_or_warning(tmp_path: Any) -> None:
    for host in HOSTS:
        for lr in (0, 7):
            ctx = two_host_ctx(tmp_path / host / str(lr), host=host, local_rank=lr)
            found = run_stage("local", (ctx,), rank=ctx.rank, select=["DDP1", "DDP2"])
            bad = [f"{f.id} {f.severity}: {f.message}" for f in found if f.severity != "info"]
            assert bad == []
            # algo-1 is node 1 here, and the info check says why
            assert any(f.id == "DDP206" and "master is algo-2" in f.message for f in found)


def test_not_sagemaker_yields_nothing() -> None:
    ctx = make_ctx(torchrun_env(rank=0, world_size=2))
    assert ctx.sagemaker is None
    assert run(ctx, "DDP2") == []


# DDP201 config unreadable

@pytest.mark.parametrize("raw", ["2", "algo-1,algo-2"])
def test_ddp201_sm_hosts_not_a_json_list(tmp_path: Any, raw: str) -> None:
    root = write_sm_config(tmp_path)
    f = one(make_ctx({**sm_env(), "SM_HOSTS": raw}, gpus=8, sm_root=root), "DDP201")
    assert f.severity == "error" and repr(raw) in f.message and 'json.loads(os.environ["SM_HOSTS"])' in f.hint


def test_ddp201_framework_params_bad_json_quotes_value(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path)
    f = one(make_ctx({**sm_env(), "SM_FRAMEWORK_PARAMS": "{sagemaker: 1"}, gpus=8, sm_root=root), "DDP201")
    assert "SM_FRAMEWORK_PARAMS" in f.message and "{sagemaker: 1" in f.message


def test_ddp201_resourceconfig_missing_is_a_warning(tmp_path: Any) -> None:
    f = one(make_ctx(sm_env(), gpus=8, sm_root=str(tmp_path)), "DDP201")
    assert f.severity == "warning" and "resourceconfig.json is missing" in f.message


@pytest.mark.parametrize("rc,needle", [
    ("[]", "not a JSON object"),
    ("{not json", "unreadable"),
    ({"hosts": None, "current_host": "algo-1"}, "hosts is None"),
    ({"hosts": ["algo-1"], "current_host": "algo-1", "instance_groups": [{"hosts": "algo-1"}]},
     "instance_groups[0]"),
])
def test_ddp201_resourceconfig_broken(tmp_path: Any, rc: Any, needle: str) -> None:
    root = write_sm_config(tmp_path, resourceconfig=rc)
    found = run(make_ctx(sm_env(), gpus=8, sm_root=root), "DDP201")
    assert any(f.severity == "error" and needle in f.message for f in found), [f.message for f in found]


def test_ddp201_passes(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path, hyperparameters={"epochs": 3, "sagemaker_program": "train.py"})
    assert run(make_ctx(sm_env(), gpus=8, sm_root=root), "DDP201") == []


# DDP202 current host listed

def test_ddp202_current_host_not_in_hosts(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path, hosts=HOSTS, current_host="algo-3")
    found = run(make_ctx(sm_env(HOSTS, "algo-3"), gpus=8, sm_root=root), "DDP202")
    assert len(found) == 2 and all(f.severity == "error" for f in found)
    assert "SM_CURRENT_HOST='algo-3' is not in SM_HOSTS=['algo-1', 'algo-2']" in found[0].message
    assert "current_host='algo-3'" in found[1].message


def test_ddp202_passes(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path, hosts=HOSTS, current_host="algo-2")
    assert run(make_ctx(sm_env(HOSTS, "algo-2"), gpus=8, sm_root=root), "DDP202") == []


# DDP203 SM_* vs resourceconfig.json

def test_ddp203_hosts_and_current_host_differ(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path, hosts=HOSTS, current_host="algo-2")
    env = sm_env(["algo-1"], "algo-1")
    found = run(make_ctx(env, gpus=8, sm_root=root), "DDP203")
    assert [f.severity for f in found] == ["error", "error"]
    assert "SM_HOSTS=['algo-1'] but resourceconfig.json hosts are ['algo-1', 'algo-2']" in found[0].message
    assert "SM_CURRENT_HOST='algo-1' but resourceconfig.json current_host='algo-2'" in found[1].message


def test_ddp203_mpirun_master_current_host_is_a_warning(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path, hosts=HOSTS, current_host="algo-2")
    env = {**sm_env(HOSTS, "algo-1", distribution="mpi"), **mpirun_env(rank=8, world_size=16, local_world_size=8)}
    f = one(make_ctx(env, gpus=8, sm_root=root), "DDP203")
    assert f.severity == "warning" and "#158" in f.message and "'algo-1'" in f.message


def test_ddp203_passes(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path, hosts=HOSTS, current_host="algo-2")
    assert run(make_ctx(sm_env(HOSTS, "algo-2"), gpus=8, sm_root=root), "DDP203") == []


# DDP204 duplicates / order

def test_ddp204_duplicates_and_unsorted(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path / "a", hosts=["algo-1", "algo-1"])
    f = one(make_ctx(sm_env(["algo-1", "algo-1"]), gpus=8, sm_root=root), "DDP204")
    assert f.severity == "error" and "algo-1 more than once" in f.message
    hosts = ["algo-1", "algo-10", "algo-2"][::-1]
    root = write_sm_config(tmp_path / "b", hosts=hosts)
    f = one(make_ctx(sm_env(hosts), gpus=8, sm_root=root), "DDP204")
    assert f.severity == "warning" and "['algo-1', 'algo-10', 'algo-2']" in f.message


def test_ddp204_passes_with_lexicographic_order(tmp_path: Any) -> None:
    hosts = ["algo-1", "algo-10", "algo-2"]  # SageMaker's order: algo-10 before algo-2
    root = write_sm_config(tmp_path, hosts=hosts)
    assert run(make_ctx(sm_env(hosts), gpus=8, sm_root=root), "DDP204") == []


# DDP205 instance groups

def test_ddp205_group_host_outside_hosts(tmp_path: Any) -> None:
    groups = [{"instance_group_name": "g1", "instance_type": "ml.p4d.24xlarge", "hosts": ["algo-1", "algo-3"]}]
    root = write_sm_config(tmp_path, hosts=HOSTS, instance_groups=groups)
    f = one(make_ctx(sm_env(HOSTS), gpus=8, sm_root=root), "DDP205")
    assert f.severity == "error" and "'g1' lists ['algo-3']" in f.message


def test_ddp205_passes(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path, hosts=HOSTS, instance_groups=GROUPS_ALGO2_FIRST)
    assert run(make_ctx(sm_env(HOSTS), gpus=8, sm_root=root), "DDP205") == []


# DDP206 master not first by name

def test_ddp206_explains_master(tmp_path: Any) -> None:
    f = one(two_host_ctx(tmp_path, host="algo-1"), "DDP206")
    assert f.severity == "info" and "master is algo-2 (not algo-1)" in f.message and "node 1" in f.message


def test_ddp206_passes_with_sorted_groups(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path, hosts=HOSTS)
    assert run(make_ctx(sm_env(HOSTS), gpus=8, sm_root=root), "DDP206") == []


# DDP207 MASTER_ADDR

def test_ddp207_toolkit_torchrun_with_algo1_master(tmp_path: Any) -> None:
    # algo-2 is node 0 but MASTER_ADDR points at algo-1: rank 0 serves the store on the wrong host
    f = one(two_host_ctx(tmp_path, host="algo-2", master_addr="algo-1"), "DDP207")
    assert f.severity == "error" and "algo-2 runs node 0" in f.message and "MASTER_ADDR=algo-1" in f.message


def test_ddp207_user_layout_assuming_algo1_is_self_consistent_warning(tmp_path: Any) -> None:
    # Own torchrun (port 29500) with algo-1 as master and node 0: works, but not SageMaker's master.
    f = one(two_host_ctx(tmp_path, host="algo-1", group_rank=0, master_addr="algo-1", master_port=29500),
            "DDP207")
    assert f.severity == "warning" and "MASTER_ADDR=algo-1 but the SageMaker master is algo-2" in f.message


def test_ddp207_training_env_disagrees(tmp_path: Any) -> None:
    ctx = two_host_ctx(tmp_path, host="algo-2")
    env = dict(ctx.env)
    env["SM_TRAINING_ENV"] = json.dumps({"master_hostname": "algo-1"})
    f = one(make_ctx(env, gpus=8, sm_root=ctx.sagemaker.root), "DDP207")
    assert f.severity == "error" and "master_hostname='algo-1'" in f.message


def test_ddp207_passes(tmp_path: Any) -> None:
    assert run(two_host_ctx(tmp_path, host="algo-1"), "DDP207") == []
    assert run(two_host_ctx(tmp_path / "ip", host="algo-1", master_addr="10.0.0.2"), "DDP207") == []


# DDP208 MASTER_PORT 7777

def test_ddp208_port_not_7777_is_info(tmp_path: Any) -> None:
    f = one(two_host_ctx(tmp_path, master_port=29500), "DDP208")
    assert f.severity == "info" and "MASTER_PORT=29500" in f.message and "7777" in f.message


def test_ddp208_passes(tmp_path: Any) -> None:
    assert run(two_host_ctx(tmp_path), "DDP208") == []


# DDP209 node rank

def test_ddp209_node_rank_from_sm_hosts_order(tmp_path: Any) -> None:
    # algo-1 took node rank 0 from SM_HOSTS order, but SageMaker's order makes it node 1
    f = one(two_host_ctx(tmp_path, host="algo-1", group_rank=0), "DDP209")
    assert f.severity == "error" and "GROUP_RANK=0 but this host algo-1 is at position 1" in f.message


def test_ddp209_own_torchrun_is_a_warning(tmp_path: Any) -> None:
    f = one(two_host_ctx(tmp_path, host="algo-1", group_rank=0, master_port=29400), "DDP209")
    assert f.severity == "warning" and "c10d" in f.hint


def test_ddp209_passes(tmp_path: Any) -> None:
    assert run(two_host_ctx(tmp_path, host="algo-1"), "DDP209") == []


# DDP210 world size vs hosts x ppn

def test_ddp210_world_size_one_host_only(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path, hosts=HOSTS, current_host="algo-1")
    env = {**sm_env(HOSTS, "algo-1"), **torchrun_env(rank=0, world_size=8, master_port=7777)}
    f = one(make_ctx(env, gpus=8, sm_root=root), "DDP210")
    assert f.severity == "error" and "WORLD_SIZE=8 but SageMaker runs 2 host(s)" in f.message and "= 16" in f.message
    assert "torchrun --nnodes 2 --nproc-per-node 8" in f.hint


def test_ddp210_mpirun_processes_per_host(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path, hosts=HOSTS, current_host="algo-1")
    env = {**sm_env(HOSTS, "algo-1", distribution="mpi", sagemaker_mpi_num_of_processes_per_host=4),
           **mpirun_env(rank=0, world_size=16, local_world_size=8), "MASTER_ADDR": "algo-1"}
    found = run(make_ctx(env, gpus=8, sm_root=root), "DDP210")
    assert {f.severity for f in found} == {"error"}
    assert any("OMPI_COMM_WORLD_SIZE=16" in f.message and "= 8" in f.message for f in found)
    assert any("OMPI_COMM_WORLD_LOCAL_SIZE=8 but processes per host is 4" in f.message for f in found)


def test_ddp210_passes(tmp_path: Any) -> None:
    assert run(two_host_ctx(tmp_path), "DDP210") == []


# DDP211 GPUs

@pytest.mark.parametrize("visible", [0, 4])
def test_ddp211_sm_num_gpus_vs_visible(tmp_path: Any, visible: int) -> None:
    root = write_sm_config(tmp_path)
    ctx = make_ctx(sm_env(num_gpus=8), gpus=visible, physical_gpus=8, sm_root=root)
    f = one(ctx, "DDP211")
    assert f.severity == "error" and f"SM_NUM_GPUS=8 but torch sees {visible} and NVML counts 8" in f.message


def test_ddp211_cuda_visible_devices_narrowing_is_a_warning(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path)
    env = {**sm_env(num_gpus=8), "CUDA_VISIBLE_DEVICES": "0,1"}
    f = one(make_ctx(env, gpus=2, physical_gpus=8, sm_root=root), "DDP211")
    assert f.severity == "warning" and "CUDA_VISIBLE_DEVICES='0,1'" in f.message


def test_ddp211_nvml_lost_a_gpu_and_local_rank(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path)
    env = {**sm_env(num_gpus=8), **torchrun_env(rank=8, world_size=9, local_rank=8, local_world_size=9)}
    found = run(make_ctx(env, gpus=8, physical_gpus=7, sm_root=root), "DDP211")
    messages = [f.message for f in found]
    assert any("NVML counts 7" in m for m in messages) and any("LOCAL_RANK=8 but SM_NUM_GPUS=8" in m for m in messages)


def test_ddp211_passes(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path, instance_type="ml.m5.xlarge")
    assert run(make_ctx(sm_env(num_gpus=8), gpus=8, sm_root=root), "DDP211") == []
    assert run(make_ctx(sm_env(num_gpus=0, distribution=None), sm_root=root), "DDP211") == []


# DDP212 smddp environment

def smddp_ctx(tmp_path: Any, extra: dict[str, str], *, backends: tuple[str, ...] = ("gloo", "nccl", "smddp")) -> Any:
    root = write_sm_config(tmp_path, hosts=HOSTS, current_host="algo-1", instance_groups=GROUPS_ALGO2_FIRST)
    env = {**sm_env(HOSTS, "algo-1", distribution="smdistributed"),
           **mpirun_env(rank=8, world_size=16, local_world_size=8), **EFA_VARS, **extra}
    return make_ctx(env, gpus=8, backends=backends, sm_root=root)


GOOD_SMDDP = {"LOCAL_RANK": "0", "SMDATAPARALLEL_LOCAL_RANK": "0", "SMDATAPARALLEL_USE_HOMOGENEOUS": "1",
              "SMDATAPARALLEL_SERVER_ADDR": "algo-2", "SMDATAPARALLEL_SERVER_PORT": "7592",
              "MASTER_ADDR": "algo-2", "MASTER_PORT": "7777"}


def test_ddp212_server_addr_is_not_master(tmp_path: Any) -> None:
    found = run(smddp_ctx(tmp_path, {**GOOD_SMDDP, "SMDATAPARALLEL_SERVER_ADDR": "algo-1"}), "DDP212")
    assert len(found) == 1 and found[0].severity == "error"
    assert "SMDATAPARALLEL_SERVER_ADDR=algo-1 but the SageMaker master is algo-2" in found[0].message


def test_ddp212_missing_variables(tmp_path: Any) -> None:
    found = run(smddp_ctx(tmp_path, {"SMDATAPARALLEL_SERVER_ADDR": "algo-2", "SMDATAPARALLEL_SERVER_PORT": "7000"}),
                "DDP212")
    by_sev = {(f.severity, f.message.split(" ")[0]) for f in found}
    assert ("warning", "LOCAL_RANK") in by_sev and ("warning", "neither") in by_sev
    assert any("SMDATAPARALLEL_SERVER_PORT='7000'" in f.message for f in found)


def test_ddp212_passes(tmp_path: Any) -> None:
    assert run(smddp_ctx(tmp_path, GOOD_SMDDP), "DDP212") == []


# DDP213 smddp instance type

@pytest.mark.parametrize("itype,severity", [("ml.g5.48xlarge", "error"), ("ml.p3dn.24xlarge", "warning")])
def test_ddp213_instance_type(tmp_path: Any, itype: str, severity: str) -> None:
    root = write_sm_config(tmp_path, instance_type=itype)
    env = {**sm_env(instance_type=itype, distribution="smdistributed"), **mpirun_env(world_size=8)}
    f = one(make_ctx(env, gpus=8, backends=("gloo", "nccl", "smddp"), sm_root=root), "DDP213")
    assert f.severity == severity and itype in f.message


def test_ddp213_passes(tmp_path: Any) -> None:
    assert run(smddp_ctx(tmp_path, GOOD_SMDDP), "DDP213") == []


# DDP214 heterogeneous cluster

def hetero_ctx(tmp_path: Any, host: str) -> Any:
    groups = [{"instance_group_name": "gpus", "instance_type": "ml.p4d.24xlarge", "hosts": ["algo-1", "algo-2"]},
              {"instance_group_name": "cpus", "instance_type": "ml.c5.xlarge", "hosts": ["algo-3"]}]
    hosts = ["algo-1", "algo-2", "algo-3"]
    root = write_sm_config(tmp_path, hosts=hosts, current_host=host, instance_groups=groups)
    env = {**sm_env(hosts, host, distribution=None), "SM_IS_HETERO": "true",
           "SM_DISTRIBUTION_INSTANCE_GROUPS": '["gpus"]'}
    return make_ctx(env, gpus=0, sm_root=root)


def test_ddp214_host_outside_distribution(tmp_path: Any) -> None:
    found = run_stage("local", (hetero_ctx(tmp_path, "algo-3"),), rank=None, select=["DDP1", "DDP2"])
    f = [x for x in found if x.id == "DDP214"][0]
    assert f.severity == "info" and "algo-3 is not in the distribution hosts ['algo-1', 'algo-2']" in f.message
    assert not [x for x in found if x.id == "DDP107"]  # not a "single process" error either


def test_ddp214_passes(tmp_path: Any) -> None:
    assert run(hetero_ctx(tmp_path, "algo-1"), "DDP214") == []


# DDP215 EFA

def test_ddp215_efa_variables_missing(tmp_path: Any) -> None:
    ctx = two_host_ctx(tmp_path, extra_env={"FI_PROVIDER": "", "NCCL_PROTO": "", "FI_EFA_USE_DEVICE_RDMA": "",
                                            "NCCL_IB_DISABLE": "1"})
    found = run(ctx, "DDP215")
    assert [f.severity for f in found] == ["warning", "warning", "warning", "info"]
    assert "FI_PROVIDER=''" in found[0].message and "NCCL_PROTO=''" in found[1].message
    assert "ml.p4d.24xlarge" in found[0].message
    assert "NCCL_IB_DISABLE=1" in found[3].message


def test_ddp215_passes(tmp_path: Any) -> None:
    assert run(two_host_ctx(tmp_path), "DDP215") == []
    # single host: EFA does not matter
    root = write_sm_config(tmp_path / "one")
    assert run(make_ctx({**sm_env(), **torchrun_env(world_size=8)}, gpus=8, sm_root=root), "DDP215") == []


# Garbage in: no check may crash (DDP001) or hang (DDP002), whatever the input.

MALFORMED_ENVS = [
    {"SM_HOSTS": "2"},
    {"SM_HOSTS": "algo-1,algo-2", "SM_CURRENT_HOST": "algo-1"},
    {"SM_HOSTS": '["algo-1"]', "SM_NUM_GPUS": "eight"},
    {"SM_HOSTS": '{"a": 1}', "SM_FRAMEWORK_PARAMS": "[1,2]", "SM_TRAINING_ENV": "null"},
    {"SM_HOSTS": '[1, 2]', "SM_CURRENT_HOST": "", "SM_IS_HETERO": "true", "SM_DISTRIBUTION_INSTANCE_GROUPS": "x"},
    {"SM_TRAINING_ENV": '{"master_hostname": 5, "distribution_hosts": "algo-1"}',
     "SM_FRAMEWORK_PARAMS": '{"sagemaker_distributed_dataparallel_enabled": true, '
                            '"sagemaker_mpi_num_of_processes_per_host": "eight"}'},
    {"RANK": "x", "WORLD_SIZE": "y", "LOCAL_RANK": "-1", "MASTER_PORT": "port", "SM_HOSTS": "[]"},
    {"TORCHELASTIC_RUN_ID": "r", "RANK": "3", "WORLD_SIZE": "2", "GROUP_RANK": "z", "LOCAL_WORLD_SIZE": "0",
     "SM_HOSTS": '["algo-1"]', "MASTER_ADDR": "::1"},
    {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "0", "SM_CURRENT_HOST": "algo-9"},
    {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "(x2)",
     "SLURM_NNODES": "0", "SM_HOSTS": '["algo-1"]', "DDP_DOCTOR_BACKEND": "???"},
]
MALFORMED_CONFIGS: list[Any] = [
    None, "[]", "{not json", {"hosts": None}, {"hosts": "algo-1", "current_host": 3},
    {"hosts": ["algo-1"], "current_host": "algo-1", "instance_groups": [{"hosts": 5}, "x", None]},
    {"hosts": ["algo-1", "algo-1"], "current_host": None, "instance_groups": {"hosts": []},
     "current_instance_type": ["ml.p4d.24xlarge"]},
    {"hosts": [], "current_host": "algo-1", "instance_groups": [{"hosts": []}]},
]


@pytest.mark.parametrize("env", MALFORMED_ENVS)
@pytest.mark.parametrize("rc", MALFORMED_CONFIGS)
def test_malformed_input_never_crashes_a_check(tmp_path: Any, env: dict[str, str], rc: Any) -> None:
    root = str(tmp_path) if rc is None else write_sm_config(tmp_path, resourceconfig=rc)
    for gpus in (0, 8):
        ctx = make_ctx(env, gpus=gpus, sm_root=root)
        found = run_stage("local", (ctx,), rank=ctx.rank, select=["DDP1", "DDP2"])
        crashed = [f"{f.id}: {f.message}" for f in found if f.id in ("DDP001", "DDP002")]
        assert crashed == []
