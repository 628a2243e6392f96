"""EFA checks (DDP215, DDP330-DDP335) on fakes shaped like the real thing: a p4d (4 EFA devices)
and a p5 (32) as sysfs/dev trees under tmp_path, a fake `fi_info` on PATH, NCCL INFO logs quoted
from public issues (facts/efa_fakes.py names each URL), and a fake NVML with 8 GPUs for the whole
node. Each check fires on its fault and stays silent on a healthy p4d/p5 layout, on CPU, off
EFA instance types and on single-node jobs. What a real EFA node would add is run by
scripts/gpu-smoke.sh on the day one is there."""
from __future__ import annotations

import os
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from facts.efa_fakes import (
    LOG_MPIRUN_SOCKET,
    LOG_P4D_EFA,
    LOG_P4D_SOCKET,
    LOG_P5EN_EFA,
    LOG_SAGEMAKER_SOCKET,
    fake_node,
)
from helpers.context import make_ctx, sm_env, torchrun_env, write_sm_config
from helpers.fake_nvml import p4d_host

from ddp_doctor import check_runner
from ddp_doctor import checks as catalogue
from ddp_doctor.checks import efa as efa_checks
from ddp_doctor.facts import efa as efa_facts
from ddp_doctor.facts import nvml
from ddp_doctor.findings import Finding
from ddp_doctor.registry import parse_sections

EFA_IDS = ["DDP215", "DDP330", "DDP331", "DDP332", "DDP333", "DDP334", "DDP335"]
LOCAL_IDS = EFA_IDS[:-1]
UNLIMITED = (None, None)


@pytest.fixture(autouse=True)
def memlock(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """memlock is unlimited unless a test says otherwise (this machine's own limit is not a fake)."""
    state: dict[str, Any] = {"limit": UNLIMITED}
    monkeypatch.setattr(efa_facts, "memlock_limit", lambda: state["limit"])
    return state


def node_ctx(root: Path, *, product: str = "p4d.24xlarge", devices: int = 4, nodes: int = 2, local_rank: int = 0,
             gpus: int = 8, env: dict[str, str] | None = None, **node: Any) -> Any:
    """Local rank `local_rank` of a torchrun job (EC2 / SLURM style, no SageMaker) over `nodes`
    nodes of 8 GPUs, on a fake node under `root`."""
    e = fake_node(root, product=product, efa_devices=devices, **node)
    e.update(torchrun_env(rank=local_rank, local_rank=local_rank, world_size=8 * nodes, local_world_size=8,
                          group_rank=0, nnodes=nodes, master_addr="10.0.0.1"))
    e.update(env or {})
    return make_ctx(e, gpus=gpus)


def run(ctx: Any, *ids: str) -> list[Finding]:
    out: list[Finding] = []
    for cid in ids or LOCAL_IDS:
        found = check_runner.run_entry(catalogue.get(cid), (ctx,), ctx.rank)
        assert not [f for f in found if f.id in ("DDP001", "DDP002")], [f.message for f in found]
        out += found
    return out


def one(ctx: Any, cid: str) -> Finding:
    found = run(ctx, cid)
    assert len(found) == 1, [f.message for f in found]
    return found[0]


# -- catalogue -------------------------------------------------------------------------------

def test_ids_and_docs() -> None:
    cat = catalogue.load_catalogue()
    for cid in EFA_IDS:
        entry = cat[cid]
        sections = parse_sections(entry.doc)
        assert all(sections.get(s) for s in ("What", "Why", "Fix")), cid
        assert entry.category == ("launcher_env" if cid == "DDP215" else "network")
    assert cat["DDP335"].stage == "group"


# -- healthy layouts: nothing fires ----------------------------------------------------------------

@pytest.mark.parametrize("product,devices", [("p4d.24xlarge", 4), ("p4de.24xlarge", 4), ("p5.48xlarge", 32),
                                             ("p5e.48xlarge", 32), ("p5en.48xlarge", 16)])
def test_healthy_node_is_silent(tmp_path: Path, product: str, devices: int) -> None:
    for lr in (0, 7):
        ctx = node_ctx(tmp_path / str(lr), product=product, devices=devices, local_rank=lr)
        assert ctx.backend == "nccl"
        assert run(ctx) == []


def test_healthy_p4d_node_whole_local_catalogue_with_fake_nvml(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole node as the local stage sees it: 8 fake A100s (NVML) and the EFA stack of a p4d.
    No network or GPU check errs or warns (host resources of this machine are not faked, so the
    host category is left out)."""
    monkeypatch.setattr(nvml, "provider", lambda: p4d_host())
    ctx = node_ctx(tmp_path)
    found = check_runner.run_stage("local", (ctx,), rank=ctx.rank, select=["network", "gpu", "DDP215"])
    assert [f"{f.id}: {f.message}" for f in found if f.severity != "info"] == []


def test_silent_on_cpu_off_efa_and_single_node(tmp_path: Path, memlock: dict[str, Any]) -> None:
    memlock["limit"] = (64 * 1024, 64 * 1024)
    broken = {"devices": 1, "plugin": None, "fi_info": "none",
              "env": {"FI_PROVIDER": "tcp", "NCCL_NET": "Socket", "NCCL_P2P_DISABLE": "1"}}
    assert run(node_ctx(tmp_path / "cpu", gpus=0, **broken)) == []                         # gloo on CPU
    assert run(node_ctx(tmp_path / "g5x", product="g5.xlarge", **broken)) == []            # no EFA type
    assert run(node_ctx(tmp_path / "dev", product="Standard PC (Q35 + ICH9, 2009)", **broken)) == []  # off AWS
    single = run(node_ctx(tmp_path / "one", nodes=1, **broken))
    assert [f.id for f in single] == ["DDP334"] and "NCCL_P2P_DISABLE=1" in single[0].message


# -- DDP330 devices --------------------------------------------------------------------------------

def test_ddp330_fewer_efa_devices_p4d(tmp_path: Path) -> None:
    f = one(node_ctx(tmp_path, devices=2), "DDP330")
    assert f.severity == "error"
    assert "2 EFA device(s) (rdmap16s27, rdmap32s27)" in f.message and "which has 4" in f.message
    assert "p4d.24xlarge (from DMI product name" in f.message
    assert f.evidence["expected_source"]


def test_ddp330_p5_with_no_efa_device(tmp_path: Path) -> None:
    f = one(node_ctx(tmp_path, product="p5.48xlarge", devices=0), "DDP330")
    assert "no EFA device (no /sys/class/infiniband" in f.message and "which has 32" in f.message
    assert "TCP sockets" in f.message


def test_ddp330_container_not_given_the_devices(tmp_path: Path) -> None:
    f = one(node_ctx(tmp_path, product="p5.48xlarge", devices=32, uverbs=8), "DDP330")
    assert "8 /dev/infiniband/uverbs*" in f.message and "the host has 32 EFA device(s)" in f.message
    assert "--device=/dev/infiniband/uverbs0" in f.hint and "vpc.amazonaws.com/efa: 32" in f.hint


def test_ddp330_only_local_rank_0_reports(tmp_path: Path) -> None:
    assert run(node_ctx(tmp_path, devices=2, local_rank=3), "DDP330") == []


# -- DDP331 libfabric ------------------------------------------------------------------------------

def test_ddp331_no_efa_provider(tmp_path: Path) -> None:
    f = one(node_ctx(tmp_path, fi_info="none"), "DDP331")
    assert "lists no efa provider" in f.message and "fi_getinfo: -61 (No data available)" in f.message
    f = one(node_ctx(tmp_path / "fp", fi_info="none", env={"FI_PROVIDER": "tcp"}), "DDP331")
    assert "FI_PROVIDER='tcp' restricts" in f.message


def test_ddp331_silent_when_unknown_or_listed(tmp_path: Path) -> None:
    assert run(node_ctx(tmp_path / "ok"), "DDP331") == []
    missing = node_ctx(tmp_path / "missing", fi_info=None, env={"PATH": str(tmp_path / "missing" / "bin")})
    assert run(missing, "DDP331") == []
    # no EFA device at all is DDP330's finding, not a second one here
    assert run(node_ctx(tmp_path / "nodev", devices=0, fi_info="none"), "DDP331") == []


# -- DDP332 plugin ---------------------------------------------------------------------------------

def test_ddp332_plugin_missing(tmp_path: Path) -> None:
    f = one(node_ctx(tmp_path, plugin=None), "DDP332")
    assert "no NCCL net plugin (libnccl-net.so" in f.message and f.severity == "error"


def test_ddp332_plugin_not_on_loader_path(tmp_path: Path) -> None:
    f = one(node_ctx(tmp_path, env={"LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}), "DDP332")
    assert "/opt/amazon/ofi-nccl/lib/libnccl-net.so" in f.message
    assert f.hint == "export LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:$LD_LIBRARY_PATH before the ranks start."


def test_ddp332_plugin_disabled(tmp_path: Path) -> None:
    f = one(node_ctx(tmp_path, env={"NCCL_NET_PLUGIN": "none"}), "DDP332")
    assert "NCCL_NET_PLUGIN='none'" in f.message


# -- DDP333 memlock --------------------------------------------------------------------------------

def test_ddp333_memlock(tmp_path: Path, memlock: dict[str, Any]) -> None:
    memlock["limit"] = (64 * 1024, 64 * 1024)        # Docker's default
    f = one(node_ctx(tmp_path), "DDP333")
    assert f.severity == "error" and "is 64 KiB (hard limit 64 KiB)" in f.message
    assert "ulimit -l unlimited" in f.hint and "memlock=-1" in f.hint
    memlock["limit"] = (1 << 30, None)
    assert one(node_ctx(tmp_path / "big"), "DDP333").severity == "warning"
    memlock["limit"] = UNLIMITED
    assert run(node_ctx(tmp_path / "ok"), "DDP333") == []


# -- DDP334 costly settings ------------------------------------------------------------------------

def test_ddp334_nccl_net_and_p2p(tmp_path: Path) -> None:
    found = run(node_ctx(tmp_path, env={"NCCL_NET": "Socket", "NCCL_P2P_DISABLE": "1"}), "DDP334")
    assert [f.severity for f in found] == ["warning", "warning"]
    assert "NCCL_NET='Socket'" in found[0].message and "fraction of EFA's bandwidth" in found[0].message
    assert "NCCL_P2P_DISABLE=1" in found[1].message
    ib = one(node_ctx(tmp_path / "ib", env={"NCCL_NET": "IB"}), "DDP334")
    assert "does not drive EFA" in ib.message
    assert run(node_ctx(tmp_path / "ofi", env={"NCCL_NET": "AWS Libfabric"}), "DDP334") == []
    # g5.48xlarge: EFA but no NVLink, so P2P off costs nothing NVLink would give
    assert run(node_ctx(tmp_path / "g5", product="g5.48xlarge", devices=1,
                        env={"NCCL_P2P_DISABLE": "1"}), "DDP334") == []


# -- DDP215 on any launcher --------------------------------------------------------------------------

def test_ddp215_outside_sagemaker_flags_values_set_against_efa(tmp_path: Path) -> None:
    env = {"FI_PROVIDER": "sockets", "NCCL_PROTO": "LL128", "FI_EFA_USE_DEVICE_RDMA": "0", "NCCL_IB_DISABLE": "1"}
    found = run(node_ctx(tmp_path, env=env), "DDP215")
    assert [f.severity for f in found] == ["warning", "warning", "warning", "info"]
    assert "FI_PROVIDER='sockets' on p4d.24xlarge (from DMI product name" in found[0].message
    assert "NCCL_PROTO='LL128'" in found[1].message and "FI_EFA_USE_DEVICE_RDMA='0'" in found[2].message


def test_ddp215_outside_sagemaker_unset_is_fine(tmp_path: Path) -> None:
    # aws-ofi-nccl picks the efa provider and the protocol itself
    assert run(node_ctx(tmp_path), "DDP215") == []
    assert run(node_ctx(tmp_path / "set", env={"FI_PROVIDER": "efa", "NCCL_PROTO": "simple"}), "DDP215") == []


def test_ddp215_instance_type_override(tmp_path: Path) -> None:
    """DMI hidden (some containers): DDP_DOCTOR_INSTANCE_TYPE says what the node is."""
    ctx = node_ctx(tmp_path, env={"FI_PROVIDER": "tcp", efa_facts.INSTANCE_TYPE_ENV: "p5.48xlarge"},
                   product="unknown")
    f = one(ctx, "DDP215")
    assert "p5.48xlarge (from DDP_DOCTOR_INSTANCE_TYPE)" in f.message


def test_ddp215_sagemaker_semantics_kept(tmp_path: Path) -> None:
    hosts = ["algo-1", "algo-2"]
    root = write_sm_config(tmp_path / "sm", hosts=hosts)
    env = {**sm_env(hosts, "algo-1", master="algo-1"),
           **torchrun_env(rank=0, world_size=16, local_world_size=8, nnodes=2, master_addr="algo-1", master_port=7777),
           efa_facts.SYS_ROOT_ENV: str(tmp_path / "empty")}
    found = run(make_ctx(env, gpus=8, sm_root=root), "DDP215")
    assert [f.severity for f in found] == ["warning", "warning", "warning"]
    assert "FI_PROVIDER is unset on ml.p4d.24xlarge" in found[0].message


# -- DDP335 the network NCCL chose -------------------------------------------------------------------

def _group(world: int = 16) -> Any:
    return SimpleNamespace(backend="nccl", world_size=world, device="cuda:0", rank=0, timeout=30.0)


@pytest.fixture
def warmups(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    monkeypatch.setattr(efa_checks, "_warm_up", calls.append)
    return calls


def run_group(ctx: Any, group: Any) -> list[Finding]:
    found = check_runner.run_entry(catalogue.get("DDP335"), (ctx, group), ctx.rank)
    assert not [f for f in found if f.id in ("DDP001", "DDP002")], [f.message for f in found]
    return found


@pytest.mark.parametrize("log,quoted", [
    (LOG_P4D_SOCKET, "NET/Socket : Using [0]eth0:10.36.29.253<0>"),
    (LOG_SAGEMAKER_SOCKET, "NCCL INFO Using network Socket"),
    (LOG_MPIRUN_SOCKET, "NCCL INFO Using network Socket"),
])
def test_ddp335_socket_on_efa_instance(tmp_path: Path, warmups: list[Any], log: str, quoted: str) -> None:
    (tmp_path / "nccl.log").write_text(log)
    ctx = node_ctx(tmp_path / "node", env={"NCCL_DEBUG_FILE": str(tmp_path / "nccl.log")})
    found = run_group(ctx, _group())
    assert len(found) == 1 and found[0].severity == "error", [f.message for f in found]
    assert quoted in found[0].message and "aws-ofi-nccl initialization failed" in found[0].message
    assert "p4d.24xlarge" in found[0].message and len(warmups) == 1


@pytest.mark.parametrize("log", [LOG_P4D_EFA, LOG_P5EN_EFA, ""])
def test_ddp335_silent_on_efa_or_no_verdict(tmp_path: Path, warmups: list[Any], log: str) -> None:
    (tmp_path / "nccl.log").write_text(log)
    ctx = node_ctx(tmp_path / "node", env={"NCCL_DEBUG_FILE": str(tmp_path / "nccl.log")})
    assert run_group(ctx, _group()) == []


def test_ddp335_debug_file_pattern_and_option(tmp_path: Path, warmups: list[Any]) -> None:
    log = tmp_path / f"nccl.{socket.gethostname()}.{os.getpid()}.log"
    log.write_text(LOG_SAGEMAKER_SOCKET)
    ctx = node_ctx(tmp_path / "node", env={"NCCL_DEBUG_FILE": str(tmp_path / "nccl.%h.%p.log")})
    assert len(run_group(ctx, _group())) == 1
    other = tmp_path / "explicit.log"
    other.write_text(LOG_P4D_SOCKET)
    ctx = make_ctx(dict(ctx.env), gpus=8, options={"nccl_debug_file": str(other)})
    assert str(other) in run_group(ctx, _group())[0].message


def test_ddp335_no_log_off_efa_and_cpu(tmp_path: Path, warmups: list[Any]) -> None:
    (tmp_path / "nccl.log").write_text(LOG_SAGEMAKER_SOCKET)
    assert run_group(node_ctx(tmp_path / "a"), _group()) == []                      # no NCCL_DEBUG_FILE
    debug = {"NCCL_DEBUG_FILE": str(tmp_path / "nccl.log")}
    assert run_group(node_ctx(tmp_path / "b", product="g5.xlarge", env=debug), _group()) == []
    assert len(warmups) == 2          # every NCCL rank creates its communicator, EFA or not
    gloo = SimpleNamespace(backend="gloo", world_size=16, device="cpu", rank=0, timeout=30.0)
    assert run_group(node_ctx(tmp_path / "c", gpus=0, env=debug), gloo) == []
    assert run_group(node_ctx(tmp_path / "d", env=debug), _group(world=1)) == []
    assert len(warmups) == 2          # ... and no collective on gloo or a world of one


def test_ddp330_uverbs_without_sysfs(tmp_path: Path) -> None:
    """Some containers hide /sys/class/infiniband: the device files are all there is to count."""
    ctx = node_ctx(tmp_path, devices=0, uverbs=2)
    f = one(ctx, "DDP330")
    assert "2 /dev/infiniband/uverbs* device file(s) and no /sys/class/infiniband" in f.message
    assert "2/4 of the EFA bandwidth" in f.message
    assert run(node_ctx(tmp_path / "all", devices=0, uverbs=4), "DDP330") == []


def test_real_host_never_crashes() -> None:
    """This machine's own /sys, /dev, PATH and limits, said to be one node of a 2-node p5 job:
    findings or not, no check crashes or hangs."""
    env = {**torchrun_env(rank=0, world_size=16, local_world_size=8, nnodes=2),
           efa_facts.INSTANCE_TYPE_ENV: "p5.48xlarge", "PATH": os.environ.get("PATH", "")}
    ctx = make_ctx(env, gpus=8)
    run(ctx)


def test_warm_up_runs_one_bounded_all_reduce(tmp_path: Path) -> None:
    """The real _warm_up on a real (gloo, one-rank) process group: the calls it makes exist and
    are bounded by Group.wait."""
    import torch.distributed as dist

    from ddp_doctor.context import Group
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        efa_checks._warm_up(Group(rank=0, world_size=1, backend="gloo", device="cpu", timeout=10.0))
    finally:
        dist.destroy_process_group()
