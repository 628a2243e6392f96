"""A port already in use is not a missing node: `ddp-doctor run
--master-port P` while another process listens on P must say that P is taken and by whom
(DDP313), never that a node never joined (DDP320), in a one-node job and on node 0 of several."""
from __future__ import annotations

import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.procs import DDP, assert_clean_output, clean_env, free_port, ids, load_json, run

from ddp_doctor.preflight_ranks import launcher_rendezvous

SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
TORCH_BIND = ("The server socket has failed to listen on any local network address. port: {port}, "
              "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")


def _listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.slow
def test_a_taken_master_port_names_the_port_and_its_holder(tmp_path):
    report = tmp_path / "r.json"
    with _listening() as holder:  # held by this test's own process: its pid must be named
        port = holder.getsockname()[1]
        res = run([*DDP, "run", "--nproc-per-node", "2", "--master-port", str(port), "--skip", "communication",
                   "--report", str(report), str(SCRIPTS / "ok_allreduce.py")], clean_env(), str(tmp_path),
                  timeout=120.0)  # run() fails the test on a hang or on anything left behind
    assert res.rc != 0, res.output
    assert_clean_output(res)
    rep = load_json(str(report))
    assert rep["status"] == "fail" and "DDP320" not in ids(rep), rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP313", cause
    assert f"MASTER_PORT={port}" in cause["message"] and f"pid {os.getpid()}" in cause["message"], cause
    assert "never joined" not in cause["message"] and "security group" not in (cause["hint"] or "")
    assert "--standalone" in cause["hint"] and f"kill {os.getpid()}" in cause["hint"]
    assert [h["pid"] for h in cause["evidence"]["holders"]] == [os.getpid()]
    assert "DDP313" in res.output and f"pid {os.getpid()}" in res.output


def _args(**kw: str) -> SimpleNamespace:
    base = dict(nnodes="1", node_rank="0", nproc_per_node="2", master_addr="127.0.0.1",
                master_port="29500", rdzv_backend="static", rdzv_endpoint="", rdzv_conf="")
    return SimpleNamespace(**{**base, **kw})


def test_a_bind_failure_is_a_port_in_use_on_one_node_and_on_node_0_of_several():
    with _listening() as holder:
        port = holder.getsockname()[1]
        error = RuntimeError(TORCH_BIND.format(port=port))
        one = launcher_rendezvous.rendezvous_finding(_args(master_port=str(port)), error)
        several = launcher_rendezvous.rendezvous_finding(_args(nnodes="2", master_port=str(port),
                                                 rdzv_conf="timeout=10,join_timeout=10"), error)
    for f in (one, several):
        assert f.id == "DDP313" and f"MASTER_PORT={port}" in f.message, f.message
        assert f"pid {os.getpid()}" in f.message and "never joined" not in f.message
        assert f.evidence["holders"][0]["pid"] == os.getpid()
    assert "--standalone" in one.hint
    assert "the same on each" in several.hint and "--standalone" not in several.hint
    assert several.evidence["nnodes"] == 2 and one.evidence["nnodes"] == 1  # the node report's world


def test_a_bind_failure_wrapped_by_the_c10d_rendezvous_is_seen():
    try:
        try:
            raise RuntimeError(TORCH_BIND.format(port=29517))
        except RuntimeError as inner:
            raise ConnectionError("The connection to the C10d store has failed. See inner exception "
                                  "for details.") from inner
    except ConnectionError as e:
        f = launcher_rendezvous.rendezvous_finding(_args(nnodes="2", master_port="29517"), e)
    assert f.id == "DDP313" and "29517" in f.message
    assert "unknown process" in f.message  # nobody holds 29517 any more: named as unknown, not dropped


def test_a_missing_node_is_still_a_missing_node():
    f = launcher_rendezvous.rendezvous_finding(_args(nnodes="2", rdzv_conf="timeout=10"),
                                 TimeoutError("Timed out after 11 seconds waiting for clients. 1/2 clients joined."))
    assert f.id == "DDP320" and "node 1 never joined" in f.message and list(f.ranks) == [2, 3]


@pytest.mark.slow
def test_a_one_node_rendezvous_failure_is_never_a_missing_node():
    port = free_port()  # nothing listens: the launcher's own store is not there
    f = launcher_rendezvous.rendezvous_finding(_args(master_port=str(port)),
                                               TimeoutError("Timed out waiting for clients"))
    assert f.id != "DDP320" and "never joined" not in f.message, f.message
    assert f.id == "DDP311" and f"127.0.0.1:{port}" in f.message and "one node" in f.message


def test_the_parent_never_waits_for_another_node_in_a_one_node_job(tmp_path):
    import time

    from ddp_doctor.training.run import stall_watch
    opts = SimpleNamespace(timeout=10.0)
    long_ago = time.monotonic() - 10.0 - stall_watch.NODES_GRACE - 1
    for nnodes in ("1", "1:1"):
        assert not stall_watch.nodes_never_met(str(tmp_path), ["--nnodes", nnodes], opts, long_ago)
    assert not (tmp_path / "preflight").exists()
    assert stall_watch.nodes_never_met(str(tmp_path), ["--nnodes", "1:2", "--master-port", "29999"], opts, long_ago)
