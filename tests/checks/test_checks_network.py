from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers.context import make_ctx, sm_env, torchrun_env, write_sm_config

from ddp_doctor import check_runner, registry
from ddp_doctor import checks as catalogue
from ddp_doctor.checks import network
from ddp_doctor.checks.network import nccl_selects, parse_nccl_ifname
from ddp_doctor.context import RankContext
from ddp_doctor.findings import Finding

BAD_HOST = "nonexistent-host.invalid"  # .invalid never resolves (RFC 2606)


def run(check_id: str, ctx: RankContext) -> list[Finding]:
    """Run one check the way the runner does (time bound, crash capture)."""
    return check_runner.run_entry(catalogue.get(check_id), (ctx,), ctx.rank)


def test_catalogue_entries() -> None:
    catalogue.load_catalogue()
    ids = [c.id for c in registry.REGISTRY.values() if c.category == "network" and c.id < "DDP310"]
    assert ids and all("DDP300" <= i <= "DDP309" for i in ids)
    for i in ids:
        entry = catalogue.get(i)
        assert entry.stage == "local" and set(entry.sections) - {"Severity"} == {"What", "Why", "Fix"}


# --- DDP300: host names resolve -------------------------------------------------------------

def test_master_addr_resolves() -> None:
    ctx = make_ctx(torchrun_env(world_size=2, master_addr="localhost"))
    assert run("DDP300", ctx) == []


def test_master_addr_ip_needs_no_dns() -> None:
    assert run("DDP300", make_ctx(torchrun_env(world_size=2, master_addr="10.0.0.1"))) == []


def test_no_host_names_nothing_to_do() -> None:
    assert run("DDP300", make_ctx({})) == []


def test_unresolvable_sagemaker_host_is_named_quickly(tmp_path: Path) -> None:
    ctx = make_ctx(sm_env(["localhost", BAD_HOST], "localhost"), sm_root=tmp_path)
    (f,) = run("DDP300", ctx)
    assert f.id == "DDP300" and f.severity == "error" and f.category == "network"
    assert BAD_HOST in f.message and "SM_HOSTS" in f.message
    assert "SM_HOSTS" in f.hint
    # fails fast: the resolver's own answer (no such name), not the bound running out
    assert f.evidence["failed"][BAD_HOST] and "did not resolve within" not in f.evidence["failed"][BAD_HOST]


def test_master_addr_is_left_to_the_rendezvous() -> None:
    # the rendezvous resolves MASTER_ADDR on every rank and reports DDP310; not twice
    assert run("DDP300", make_ctx(torchrun_env(world_size=2, master_addr=BAD_HOST))) == []


def test_sagemaker_hosts_from_sm_hosts_and_resourceconfig(tmp_path: Path) -> None:
    root = write_sm_config(tmp_path, hosts=["localhost", BAD_HOST], current_host="localhost")
    env = {**sm_env(["localhost", BAD_HOST], "localhost"), **torchrun_env(world_size=2, master_addr="localhost")}
    (f,) = run("DDP300", make_ctx(env, sm_root=root))
    assert f"{BAD_HOST} (from SM_HOSTS, resourceconfig.json hosts)" in f.message
    assert "1 of 2 host name(s)" in f.message
    assert "SM_HOSTS" in f.hint and "waits" in f.hint


def test_sagemaker_hosts_all_resolve(tmp_path: Path) -> None:
    root = write_sm_config(tmp_path, hosts=["localhost"], current_host="localhost")
    assert run("DDP300", make_ctx(sm_env(["localhost"], "localhost"), sm_root=root)) == []


def test_resolution_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def slow(host: str, *args: Any) -> Any:
        if host == "slow-host":
            release.wait(30)  # a resolver that does not answer
        return socket.getaddrinfo(host, *args)

    monkeypatch.setattr(network, "_getaddrinfo", slow)
    monkeypatch.setattr(network, "RESOLVE_TIMEOUT_S", 0.3)
    out = network.resolve_all(["slow-host", "localhost"], timeout=0.3)
    # "did not resolve within": the lookup was abandoned at its bound (the resolver never answered)
    assert out == {"slow-host": "did not resolve within 0.3 s", "localhost": None}
    (f,) = run("DDP300", make_ctx(sm_env(["slow-host"], "slow-host"), sm_root=Path("/nonexistent")))
    release.set()
    assert "slow-host (from SM_HOSTS): did not resolve within 0.3 s" in f.message


# --- NCCL_SOCKET_IFNAME syntax --------------------------------------------------------------

@pytest.mark.parametrize("spec, iface, selected", [
    ("eth", "eth0", True), ("eth0", "eth0", True), ("eth0", "eth01", True), ("=eth0", "eth01", False),
    ("=eth0", "eth0", True), ("ens,eth", "eth1", True), ("ib", "eth0", False),
    ("^docker,lo", "eth0", True), ("^docker,lo", "docker0", False), ("^=docker0", "docker01", True),
    ("^eth", "lo", True), (" eth0 ", "eth0", True),
])
def test_nccl_selects(spec: str, iface: str, selected: bool) -> None:
    assert nccl_selects(spec, iface) is selected


def test_parse_nccl_ifname() -> None:
    assert parse_nccl_ifname("^=docker0,lo") == (True, [("docker0", True), ("lo", False)])
    assert parse_nccl_ifname("eth0,") == (False, [("eth0", False)])


# --- DDP301: interfaces exist ---------------------------------------------------------------

IFACES = ("lo", "eth0", "docker0")


@pytest.mark.parametrize("env", [
    {"NCCL_SOCKET_IFNAME": "eth"}, {"NCCL_SOCKET_IFNAME": "=eth0"}, {"NCCL_SOCKET_IFNAME": "ens,eth0"},
    {"NCCL_SOCKET_IFNAME": "^docker"}, {"GLOO_SOCKET_IFNAME": "eth0,lo"},
    {"SM_NETWORK_INTERFACE_NAME": "eth0"}, {},
])
def test_interfaces_present(env: dict[str, str]) -> None:
    assert run("DDP301", make_ctx(env, gpus=1, interfaces=IFACES)) == []


def test_nccl_ifname_matches_nothing() -> None:
    (f,) = run("DDP301", make_ctx({"NCCL_SOCKET_IFNAME": "=eth"}, gpus=8, interfaces=IFACES))
    assert f.severity == "error"
    assert "NCCL_SOCKET_IFNAME='=eth' matches no interface" in f.message
    assert "lo, eth0, docker0" in f.message


def test_nccl_ifname_missing_with_gloo_backend_is_a_warning() -> None:
    (f,) = run("DDP301", make_ctx({"NCCL_SOCKET_IFNAME": "ens5"}, interfaces=IFACES))
    assert f.severity == "warning" and "gloo backend does not read it" in f.message


def test_gloo_ifname_names_each_missing_interface() -> None:
    (f,) = run("DDP301", make_ctx({"GLOO_SOCKET_IFNAME": "eth0,eth1,ens5"}, interfaces=IFACES))
    assert f.severity == "error"
    assert "'eth1', 'ens5', which do not exist" in f.message
    assert f.evidence["missing"] == ["eth1", "ens5"]


def test_gloo_ifname_is_exact_not_prefix() -> None:
    (f,) = run("DDP301", make_ctx({"GLOO_SOCKET_IFNAME": "eth"}, interfaces=IFACES))
    assert "'eth', which does not exist" in f.message


def test_sm_interface_missing(tmp_path: Path) -> None:
    root = write_sm_config(tmp_path)
    env = {**sm_env(), "SM_NETWORK_INTERFACE_NAME": "ens5", "NCCL_SOCKET_IFNAME": "ens5"}
    findings = run("DDP301", make_ctx(env, gpus=8, interfaces=IFACES, sm_root=root))
    assert {(f.evidence["variable"], f.severity) for f in findings} == {
        ("NCCL_SOCKET_IFNAME", "error"), ("SM_NETWORK_INTERFACE_NAME", "warning")}


def test_unknown_interfaces_are_not_judged() -> None:
    assert run("DDP301", make_ctx({"NCCL_SOCKET_IFNAME": "ens5"}, gpus=1, interfaces=())) == []


# --- DDP302: exclusion leaves loopback only -------------------------------------------------

def test_exclusion_leaves_only_loopback_multi_node() -> None:
    env = {**torchrun_env(rank=0, world_size=16, local_world_size=8), "NCCL_SOCKET_IFNAME": "^eth,docker"}
    (f,) = run("DDP302", make_ctx(env, gpus=8, interfaces=IFACES))
    assert f.severity == "warning" and "leaves only the loopback" in f.message


def test_exclusion_of_everything_is_an_error() -> None:
    (f,) = run("DDP302", make_ctx({"NCCL_SOCKET_IFNAME": "^eth,docker,lo"}, gpus=8, interfaces=IFACES))
    assert f.severity == "error" and "excludes every interface" in f.message


@pytest.mark.parametrize("env, ifaces", [
    ({"NCCL_SOCKET_IFNAME": "^docker,lo"}, IFACES),
    ({"NCCL_SOCKET_IFNAME": "eth0"}, ("lo",)),  # not an exclusion: DDP301's business
    ({**torchrun_env(world_size=8), "NCCL_SOCKET_IFNAME": "^eth,docker"}, IFACES),  # single node
])
def test_exclusion_fine(env: dict[str, str], ifaces: tuple[str, ...]) -> None:
    assert run("DDP302", make_ctx(env, gpus=8, interfaces=ifaces)) == []


# --- DDP303: NCCL_SOCKET_IFNAME vs SageMaker's interface ------------------------------------

def test_nccl_ifname_disagrees_with_sagemaker(tmp_path: Path) -> None:
    root = write_sm_config(tmp_path)
    env = {**sm_env(), "NCCL_SOCKET_IFNAME": "docker0"}
    (f,) = run("DDP303", make_ctx(env, gpus=8, interfaces=IFACES, sm_root=root))
    assert f.severity == "warning"
    assert "NCCL_SOCKET_IFNAME='docker0' does not select SM_NETWORK_INTERFACE_NAME='eth0'" in f.message
    assert "NCCL_SOCKET_IFNAME=eth0" in f.hint


def test_resourceconfig_interface_is_used_without_the_variable(tmp_path: Path) -> None:
    root = write_sm_config(tmp_path)  # network_interface_name: eth0
    env = {k: v for k, v in sm_env().items() if k != "SM_NETWORK_INTERFACE_NAME"}
    (f,) = run("DDP303", make_ctx({**env, "NCCL_SOCKET_IFNAME": "ens"}, gpus=8, sm_root=root))
    assert "resourceconfig.json network_interface_name='eth0'" in f.message


@pytest.mark.parametrize("nccl", ["eth0", "eth", "^docker,lo", None])
def test_nccl_ifname_agrees_with_sagemaker(tmp_path: Path, nccl: str | None) -> None:
    root = write_sm_config(tmp_path)
    env = sm_env() if nccl is None else {**sm_env(), "NCCL_SOCKET_IFNAME": nccl}
    assert run("DDP303", make_ctx(env, gpus=8, interfaces=IFACES, sm_root=root)) == []


def test_not_sagemaker_no_comparison() -> None:
    assert run("DDP303", make_ctx({"NCCL_SOCKET_IFNAME": "docker0"}, gpus=8, interfaces=IFACES)) == []
