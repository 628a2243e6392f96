"""The rendezvous findings' wording (checks/rendezvous.py, DDP310-DDP326, DDP846), and the machinery's
events worded in checks/internal.py, stalls.py and launcher_env.py: pure functions over the facts
the preflight's ranks and `ddp-doctor run`'s launcher gather. Where both observe the same thing,
they say it alike; the launcher's situation (nodes, torch's error, no rank started) is a parameter."""
from __future__ import annotations

import pytest

from ddp_doctor.checks import rendezvous as ev
from ddp_doctor.checks.internal import checked_in_rank_lost, tool_failed
from ddp_doctor.checks.launcher_env import (
    BACKEND_MISSING,
    LOCAL_RANKS_EXCEED_GPUS,
    backend_missing_said,
    device_missing_said,
)
from ddp_doctor.checks.stalls import preflight_interrupted_finding
from ddp_doctor.facts.ports import PortHolder
from ddp_doctor.findings import ROOT_CAUSE, Problem
from ddp_doctor.processes.stop_signals import Interrupt


def launcher(nnodes: int = 2, node: int = 1, backend: str = "static", bound: float | None = 10.0,
             error: str = "Timed out waiting for clients") -> ev.LauncherRendezvous:
    return ev.LauncherRendezvous(nnodes, node, 4, "10.0.0.1", 29500, backend, bound, error)


REFUSED = ev.Reach(False, "refused", "10.0.0.1:29500 refused the connection", attempts=7, elapsed_s=2.0)


# ---------------------------------------------------------------- reaching the master

@pytest.mark.parametrize("kind,cid", [("unresolvable", "DDP310"), ("refused", "DDP311"), ("timeout", "DDP312"),
                                      ("unreachable", "DDP312"), ("not_store", "DDP315")])
def test_a_failed_reach_is_worded_alike_by_a_rank_and_by_the_launcher(kind: str, cid: str) -> None:
    reach = ev.Reach(False, kind, "what the probe saw", attempts=3, elapsed_s=2.0, answer="")
    rank = ev.unreachable_finding(reach, "10.0.0.1", 29500, 2.0, 1)
    node = ev.unreachable_finding(reach, "10.0.0.1", 29500, 2.0, None, launcher())
    assert rank.id == node.id == cid and rank.ranks == [1] and node.ranks == []
    # the same observation, in the same words: the launcher's message adds its own situation
    assert rank.message.startswith("MASTER_ADDR=10.0.0.1 MASTER_PORT=29500: ") and rank.message in node.message
    assert node.message.startswith("node 1 of --nnodes 2: the launcher could not join the rendezvous of node 0 "
                                   "at 10.0.0.1:29500 within 10 s (torch: Timed out waiting for clients)")
    assert node.evidence["attempts"] == rank.evidence["attempts"] == 3 and node.evidence["probe_bound_s"] == 2.0
    assert node.evidence["nnodes"] == 2 and node.evidence["bound_s"] == 10.0  # the launcher's bound
    if kind == "not_store":  # what holds the port, and how to free it, whoever found it
        for f in (rank, node):
            assert "ss -ltnp 'sport = :29500'" in f.hint and "DDP313" in f.hint
        assert rank.evidence["silent"] is True
    else:
        assert rank.hint == ev._REACH_ENTRIES.get(kind, ev.MASTER_TIMEOUT).hint  # the entry's Fix
        assert "Start node 0 first" in node.hint and "security group" in node.hint


def test_the_launcher_of_a_one_node_job_is_told_it_hosts_the_rendezvous_itself() -> None:
    f = ev.unreachable_finding(REFUSED, "10.0.0.1", 29500, 2.0, None, launcher(nnodes=1, node=0, bound=None))
    assert f.id == "DDP311" and f.message.startswith("one node: the launcher could not set up its rendezvous "
                                                     "at 10.0.0.1:29500 in time")
    assert "connection refused for 2 s (7 attempts): nothing listens there" in f.message
    assert "--standalone" in f.hint and "security group" not in f.hint


def test_a_store_that_answers_once_the_launcher_gave_up_is_said_so() -> None:
    f = ev.unreachable_finding(ev.Reach(True, attempts=1), "10.0.0.1", 29500, 2.0, None, launcher())
    assert f.id == "DDP312" and "a torch store answers there now (1 attempt(s))" in f.message


def test_a_c10d_rendezvous_is_named_by_its_endpoint() -> None:
    f = ev.unreachable_finding(REFUSED, "10.0.0.1", 29500, 2.0, None, launcher(backend="c10d"))
    assert "--rdzv-endpoint 10.0.0.1:29500: connection refused" in f.message


def test_which_launcher_failures_mean_the_master_does_not_answer() -> None:
    assert ev.launcher_reaches_out(launcher(nnodes=2, node=1))  # a node joining node 0's
    assert ev.launcher_reaches_out(launcher(nnodes=1, node=0))  # its own store, in a one-node job
    assert not ev.launcher_reaches_out(launcher(nnodes=2, node=0))  # it hosts: the others are missing
    assert not ev.launcher_reaches_out(launcher(nnodes=2, node=1, backend="c10d"))


def test_master_not_local() -> None:
    f = ev.master_not_local_finding("10.0.0.9", "host-a", 0)
    assert f.id == "DDP314" and "MASTER_ADDR=10.0.0.9 is not an address of rank 0's host host-a" in f.message


# ---------------------------------------------------------------- a store that cannot listen

def test_a_taken_port_names_its_holder_for_a_rank_0_and_for_the_launcher() -> None:
    holder = (PortHolder(4242, "python serve.py", "0.0.0.0:29500"),)
    rank = ev.port_in_use_finding(ev.PortTaken(29500, "host-a", "[Errno 98] Address already in use", holder), 0)
    node = ev.port_in_use_finding(ev.PortTaken(29500, "host-a", "EADDRINUSE", holder, launcher(node=0)), None)
    for f in (rank, node):
        assert f.id == "DDP313" and "MASTER_PORT=29500 on host host-a: the port is already in use, held by pid " \
            "4242 (python serve.py)" in f.message, f.message
        assert "kill 4242" in f.hint and f.evidence["holders"][0]["pid"] == 4242
    assert rank.message.startswith("rank 0 cannot listen") and "[Errno 98]" in rank.message and rank.ranks == [0]
    assert node.message.startswith("node 0 of --nnodes 2: the launcher's rendezvous store cannot listen")
    assert "no rank was started (torch: EADDRINUSE)" in node.message and node.evidence["nnodes"] == 2
    assert "the same on each" in node.hint and "--standalone" not in node.hint


def test_a_taken_port_whose_holder_cannot_be_seen() -> None:
    f = ev.port_in_use_finding(ev.PortTaken(29500, "host-a", "EADDRINUSE", (), launcher(nnodes=1, node=0)), None)
    assert "an unknown process" in f.message and "ss -ltnp" in f.hint and "--standalone" in f.hint


def test_two_jobs_at_one_store() -> None:
    crowd = ev.Crowd(2, 2, 1, [{"rank": 1, "pid": 11, "host": "h", "why": "claimed it first"},
                               {"rank": 1, "pid": 12, "host": "h", "why": "claimed a rank already claimed"}])
    f = ev.shared_rendezvous_finding(crowd, "127.0.0.1", 29500, 0)
    assert f.id == "DDP846" and f.ranks == [1] and f.message.startswith(
        "3 processes met at the rendezvous on MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 for WORLD_SIZE=2")
    assert "rank 1: pid 11 on host h, pid 12 on host h" in f.message and "error" not in f.evidence
    # a rank 0 that could not host, and found another job's rendezvous on its port
    host = ev.Crowd(1, 1, 1, [{"rank": 0, "pid": 7, "host": "h", "why": ev.COULD_NOT_HOST}])
    g = ev.shared_rendezvous_finding(host, "127.0.0.1", 29500, 0, ev.PortTaken(29500, "h", "in use"))
    assert g.message.startswith("rank 0 cannot listen on MASTER_PORT=29500 on host h: in use; another job's "
                                "rendezvous holds it: 2 processes met")
    assert "(could not host the store: the port was taken)" in g.message and g.evidence["error"] == "in use"


# ---------------------------------------------------------------- the meeting

def test_missing_ranks_at_the_preflight_store() -> None:
    f = ev.ranks_missing_finding(ev.Missing(world_size=4, arrived=(0, 1, 3), bound_s=3.0,
                                            master_addr="10.0.0.1", master_port=29500), 0)
    assert f.id == "DDP320" and f.ranks == [2]
    assert f.message == ("WORLD_SIZE=4 but only 3 rank(s) checked in at the rendezvous on MASTER_ADDR=10.0.0.1 "
                         "MASTER_PORT=29500 within 3 s: arrived 0-1, 3; missing 2")
    assert f.evidence["missing"] == [2] and f.evidence["timeout_s"] == 3.0 and f.evidence["check_ins"] == 3
    assert "can reach 10.0.0.1:29500" in f.hint and "security group" in f.hint


def test_missing_nodes_at_the_launchers_rendezvous_get_the_same_advice() -> None:
    f = ev.ranks_missing_finding(ev.Missing(launcher=launcher(nnodes=2, node=0), joined=1), None)
    assert f.id == "DDP320" and f.ranks == [4, 5, 6, 7] and f.evidence["missing_nodes"] == [1]
    assert f.message.startswith("--nnodes 2: node 1 never joined the launcher's rendezvous at 10.0.0.1:29500 "
                                "within 10 s (1 of 2 nodes arrived; torch: Timed out waiting for clients)")
    assert "can reach 10.0.0.1:29500" in f.hint and "security group" in f.hint and "--node-rank" in f.hint
    # several nodes, counted but not named: no rank is named missing
    g = ev.ranks_missing_finding(ev.Missing(launcher=launcher(nnodes=3, node=0), joined=2), None)
    assert g.ranks == [] and "1 of nodes 1-2 (the launcher's store counts" in g.message


def test_a_rank_claimed_twice() -> None:
    f = ev.duplicate_rank_finding(1, 2, "h", 12, {"pid": 11, "host": "g"})
    assert f.id == "DDP322" and f.message == ("RANK=1 was claimed by 2 processes (this one on host h, pid 12; "
                                              "the first on host g, pid 11)")
    assert ev.duplicate_rank_finding(1, 2, "h", 12, None).evidence == {"rank": 1, "claims": 2}


def test_process_group_store_and_verdict_failures() -> None:
    f = ev.pg_init_failed_finding("gloo", 2, 1, "RuntimeError", "connect failed")
    assert f.id == "DDP321" and "init_process_group(backend='gloo', world_size=2) failed on rank 1: " \
        "RuntimeError: connect failed" == f.message
    assert (f.cause_class, f.action) == ("network", "investigate") and "NCCL_SOCKET_IFNAME" in f.hint
    # CUDA's errors (as NCCL's init on a rank whose GPU is missing or unusable raises them): the GPU's
    missing = ev.pg_init_failed_finding("nccl", 2, 1, "AcceleratorError", "CUDA error: invalid device ordinal\n"
                                        "GPU device may be out of range, do you have enough GPUs?")
    assert (missing.cause_class, missing.action) == ("configuration", "fix_configuration")
    assert "not the network" in missing.hint and "CUDA_VISIBLE_DEVICES" in missing.hint
    busy = ev.pg_init_failed_finding("nccl", 2, 0, "RuntimeError", "CUDA error: CUDA-capable device(s) is/are busy "
                                     "or unavailable")
    assert (busy.cause_class, busy.action) == ("host", "investigate") and busy.hint == missing.hint
    hosting = ev.store_lost_finding("gone", 0, at=("h", 1), hosting=True)
    assert hosting.id == "DDP323" and hosting.message == "could not host the store at h:1: gone"
    assert ev.store_lost_finding("gone", 1, at=("h", 1)).message == "could not connect to the store at h:1: gone"
    assert ev.store_lost_finding("gone", 1).message == "the rendezvous store stopped answering: gone"
    g = ev.reporter_lost_finding(1, 90.0)
    assert g.id == "DDP324" and g.message == "rank 1 got no verdict from the reporting rank within 90 s"


def test_unreadable_views() -> None:
    assert ev.unreadable_finding({}, 0, "1.0") is None
    f = ev.unreadable_finding({2: "not a view record"}, 0, "1.0")
    assert f is not None and f.id == "DDP325" and f.ranks == [2] and "this ddp-doctor (1.0)" in f.message


def test_the_ranks_plans() -> None:
    same = ev.PlanExchange(("DDP401",), "1.0", (5, 5))
    assert ev.plans_differ_finding(same, 0) is None
    f = ev.plans_differ_finding(ev.PlanExchange(("DDP401",), "1.0", (5, 6, 5)), 0)
    assert f is not None and f.id == "DDP326" and "2 plans: rank(s) 0, 2; rank(s) 1" in f.message
    assert f.evidence == {"plan": ["DDP401"], "ddp_doctor": "1.0"} and f.caused_by is None
    g = ev.plans_differ_finding(ev.PlanExchange(("DDP401",), "1.0", None, "RuntimeError", "peer gone"), 0)
    assert g is not None and g.caused_by == ROOT_CAUSE and "(RuntimeError: peer gone)" in g.message


# ---------------------------------------------------------------- the machinery's own events

def test_the_machinerys_own_events() -> None:
    f = tool_failed(1, ValueError("bad"), "Traceback ...")
    assert f.id == "DDP005" and f.message == "ddp-doctor failed on rank 1: ValueError: bad"
    assert f.evidence == {"traceback": "Traceback ..."}
    g = checked_in_rank_lost(2, 60.0)
    assert g.id == "DDP003" and g.message == "rank 2 checked in but sent no final findings within 60 s"


def test_a_preflight_stopped_by_a_signal_is_dated_when_it_came() -> None:
    f = preflight_interrupted_finding(Interrupt(15, sender_pid=9, sender="kill", at=123.0))
    assert f.id == "DDP808" and f.time == 123.0 and f.message == "stopped by SIGTERM from pid 9 (kill) during " \
        "the preflight"


def test_a_backend_that_cannot_exist_here_skips_init_process_group() -> None:
    said = BACKEND_MISSING.finding(Problem(message="backend 'nccl' is not available here"), 0)
    assert backend_missing_said([said], "nccl", ("gloo",))
    assert not backend_missing_said([said], "gloo", ("gloo",))  # available after all: init is tried
    assert not backend_missing_said([], "nccl", ("gloo",))  # not said: init says why


def test_a_gpu_that_does_not_exist_skips_init_process_group() -> None:
    """Two ranks on a 1-GPU host: rank 1's cuda:1 does not exist, DDP109 says so, and its init
    (NCCL: "invalid device ordinal") is not tried; rank 0's cuda:0 exists and is tried."""
    said = LOCAL_RANKS_EXCEED_GPUS.finding(Problem(message="LOCAL_WORLD_SIZE=2 ranks but 1 GPU"), 1)
    assert device_missing_said([said], "cuda:1", 1)
    assert not device_missing_said([said], "cuda:0", 1)
    assert not device_missing_said([], "cuda:1", 1)  # not said: init says why
    assert not device_missing_said([said], "cpu", 0)
