"""ddp_doctor.facts.efa on fakes: a sysfs/dev tree under tmp_path shaped like a p4d (4 EFA devices)
and a p5 (32), a fake `fi_info` on PATH, and NCCL INFO logs quoted from public issues (each with
its URL, in facts/efa_fakes.py). No EFA device, libfabric or NCCL exists on the machines these tests run on."""
from __future__ import annotations

from pathlib import Path

import pytest
from facts.efa_fakes import (
    FI_INFO_EFA_OUTPUT,
    LOG_CHANNELS_EFA,
    LOG_MPIRUN_SOCKET,
    LOG_P4D_EFA,
    LOG_P4D_SOCKET,
    LOG_P5EN_EFA,
    LOG_SAGEMAKER_SOCKET,
    fake_node,
)

from ddp_doctor.facts import efa

# ---------------------------------------------------------------------------------------------
# Instance type

def test_instance_type_order(tmp_path: Path) -> None:
    env = fake_node(tmp_path, product="p5.48xlarge")
    assert efa.instance_type(env) == efa.InstanceTypeSeen("p5.48xlarge", f"DMI product name ({efa.DMI_PRODUCT_NAME})")
    seen = efa.instance_type(env, sagemaker="ml.p4d.24xlarge")
    assert (seen.name, seen.source.startswith("SageMaker")) == ("ml.p4d.24xlarge", True)
    seen = efa.instance_type({**env, efa.INSTANCE_TYPE_ENV: "p4de.24xlarge"}, sagemaker="ml.p4d.24xlarge")
    assert (seen.name, seen.source) == ("p4de.24xlarge", efa.INSTANCE_TYPE_ENV)
    seen = efa.instance_type(env, option="p5en.48xlarge")
    assert (seen.name, seen.source) == ("p5en.48xlarge", "--instance-type")


def test_instance_type_unknown_without_dmi(tmp_path: Path) -> None:
    assert efa.instance_type({efa.SYS_ROOT_ENV: str(tmp_path)}) is None
    assert efa.dmi_product_name(str(tmp_path)) is None


# ---------------------------------------------------------------------------------------------
# Devices

@pytest.mark.parametrize("count", [4, 32])
def test_efa_devices_p4d_p5(tmp_path: Path, count: int) -> None:
    env = fake_node(tmp_path, efa_devices=count)
    dev = efa.efa_devices(efa.sys_root(env))
    assert len(dev.efa) == count and len(dev.uverbs) == count and dev.sysfs_readable
    assert dev.efa[0] == "rdmap112s27" or dev.efa[0].startswith("rdmap")
    assert dev.other == ()


def test_efa_devices_other_driver_and_container_without_devices(tmp_path: Path) -> None:
    env = fake_node(tmp_path, efa_devices=2, other=("mlx5_0",), uverbs=0)
    dev = efa.efa_devices(efa.sys_root(env))
    assert len(dev.efa) == 2 and dev.other == ("mlx5_0",) and dev.uverbs == ()


def test_efa_devices_none(tmp_path: Path) -> None:
    dev = efa.efa_devices(str(tmp_path))
    assert dev == efa.EfaDevices((), (), (), False)


# ---------------------------------------------------------------------------------------------
# libfabric

def test_parse_fi_info() -> None:
    providers, domains = efa.parse_fi_info(FI_INFO_EFA_OUTPUT)
    assert providers == ("efa", "efa", "efa;ofi_rxd") and domains[0] == "efa_0-rdm"


def test_fi_info_lists_efa(tmp_path: Path) -> None:
    fi = efa.fi_info_efa(fake_node(tmp_path))
    assert fi.status == "ok" and fi.has_efa and fi.returncode == 0 and fi.path.endswith("bin/fi_info")


def test_fi_info_lists_none(tmp_path: Path) -> None:
    fi = efa.fi_info_efa(fake_node(tmp_path, fi_info="none"))
    assert fi.status == "ok" and not fi.has_efa and fi.returncode == 61 and "-61" in fi.output


def test_fi_info_missing_is_unknown(tmp_path: Path) -> None:
    env = fake_node(tmp_path, fi_info=None)
    env["PATH"] = str(tmp_path / "bin")
    assert efa.fi_info_efa(env).status == "not_found"


def test_fi_info_is_bounded(tmp_path: Path) -> None:
    fi = efa.fi_info_efa(fake_node(tmp_path, fi_info="slow"), timeout=0.5)
    assert fi.status == "timeout"


# ---------------------------------------------------------------------------------------------
# The plugin

def test_plugin_found_on_ld_library_path(tmp_path: Path) -> None:
    p = efa.find_net_plugin(fake_node(tmp_path))
    assert p.loadable == ("/opt/amazon/ofi-nccl/lib/libnccl-net.so",) and not p.disabled


def test_plugin_installed_but_not_on_the_loader_path(tmp_path: Path) -> None:
    env = fake_node(tmp_path)
    env["LD_LIBRARY_PATH"] = "/usr/local/cuda/lib64"
    p = efa.find_net_plugin(env)
    assert p.loadable == () and p.elsewhere == ("/opt/amazon/ofi-nccl/lib/libnccl-net.so",)
    # ... which an ld.so.conf.d entry fixes, as the EFA installer's would
    conf = tmp_path / "etc/ld.so.conf.d"
    conf.mkdir(parents=True)
    (conf / "aws-ofi-nccl.conf").write_text("# added by the installer\n/opt/amazon/ofi-nccl/lib\n")
    assert efa.find_net_plugin(env).loadable == ("/opt/amazon/ofi-nccl/lib/libnccl-net.so",)


def test_plugin_names_follow_nccl_net_plugin(tmp_path: Path) -> None:
    assert efa.plugin_names({}) == efa.PLUGIN_NAMES
    assert efa.plugin_names({"NCCL_NET_PLUGIN": "ofi"}) == ("libnccl-net-ofi.so", "ofi")
    assert efa.plugin_names({"NCCL_NET_PLUGIN": "/x/libnccl-net-custom.so"}) == ("/x/libnccl-net-custom.so",)
    env = {**fake_node(tmp_path, plugin="/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"), "NCCL_NET_PLUGIN": "ofi"}
    assert efa.find_net_plugin(env).loadable == ("/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so",)
    assert efa.find_net_plugin({**env, "NCCL_NET_PLUGIN": "none"}).disabled


def test_plugin_missing(tmp_path: Path) -> None:
    p = efa.find_net_plugin(fake_node(tmp_path, plugin=None))
    assert p.loadable == () and p.elsewhere == ()


# ---------------------------------------------------------------------------------------------
# memlock (the real limit of this process: only its shape is checked)

def test_memlock_shape() -> None:
    soft, hard = efa.memlock_limit()
    assert soft is None or soft >= 0
    assert hard is None or (soft is not None and hard >= soft)


# ---------------------------------------------------------------------------------------------
# NCCL's INFO output

@pytest.mark.parametrize("log,kind,name", [
    (LOG_P4D_SOCKET, "Socket", "Socket"),
    (LOG_SAGEMAKER_SOCKET, "Socket", "Socket"),
    (LOG_MPIRUN_SOCKET, "Socket", "Socket"),
    (LOG_P4D_EFA, "OFI", "AWS Libfabric"),
    (LOG_P5EN_EFA, "OFI", "Libfabric"),
    (LOG_CHANNELS_EFA, "OFI", "AWS Libfabric"),
    ("", None, None),
])
def test_nccl_network(log: str, kind: str | None, name: str | None) -> None:
    net = efa.nccl_network(log.splitlines())
    assert (net.kind, net.name) == (kind, name)


def test_nccl_network_keeps_the_plugin_failure_and_provider() -> None:
    net = efa.nccl_network(LOG_P4D_SOCKET.splitlines())
    assert net.lines == ("ip-10-36-29-253:84:2553 [0] NCCL INFO NET/Socket : Using [0]eth0:10.36.29.253<0>",)
    assert any("aws-ofi-nccl initialization failed" in x for x in net.plugin_failed)
    assert net.provider == "efa"
    healthy = efa.nccl_network(LOG_P5EN_EFA.splitlines())
    assert healthy.plugin_failed == () and healthy.provider == "efa"
    assert efa.nccl_network(LOG_P4D_EFA.splitlines()).plugin_failed == ()


def test_nccl_debug_file_expansion(tmp_path: Path) -> None:
    assert efa.expand_nccl_debug_file("/tmp/nccl.%h.%p.log", hostname="algo-1", pid=42) == "/tmp/nccl.algo-1.42.log"
    log = tmp_path / "nccl.log"
    log.write_text(LOG_SAGEMAKER_SOCKET)
    assert efa.read_log_lines(str(log))[-1].endswith("Using network Socket")
    assert efa.read_log_lines(str(log), max_bytes=30) is not None
    assert efa.read_log_lines(str(tmp_path / "missing.log")) is None
