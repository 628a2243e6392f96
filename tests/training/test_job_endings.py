"""Every rank's ending in the job's store (training/run/endings.py), against a real TCPStore: the
verdict of a job on several nodes needs every rank's ending, and a rank seen gone on its node is
named on the others."""
from __future__ import annotations

import json
import os

import pytest

from ddp_doctor.training import records
from ddp_doctor.training.run import endings

torch_dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def store_env(monkeypatch):
    """A store on a free port, hosted in this process, and the variables a rank finds it by. A
    rank's exchange connects within half its bound (2 s): under the whole suite on 2 cores one
    connection to this store once took longer, so the tests give it 15 s (their subject is what
    is exchanged; the bounds that are a test's subject are set by that test)."""
    from helpers.procs import free_port
    monkeypatch.setattr(endings, "STORE_BOUND", 15.0)
    port = free_port()
    store = torch_dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
           "TORCHELASTIC_RUN_ID": f"t{os.getpid()}-{port}"}
    yield env
    del store


def _node(tmp_path, name, ranks, exit_codes):
    """A node's run directory with its ranks' outcome records."""
    d = tmp_path / name
    d.mkdir()
    for r in ranks:
        records.write_outcome(str(d), r, {"exit_code": exit_codes.get(r, 0), "exception": None})
    return str(d)


@pytest.mark.slow
def test_the_last_rank_of_the_job_copies_every_ending_and_a_gone_rank_is_named_on_the_other_node(tmp_path, store_env,
                                                                                             monkeypatch):
    # a failed rank waits out its bound for the others' endings (10 s): what it saw by then is the subject
    monkeypatch.setattr(endings, "FAILED_BOUND", 3.0)
    node1 = _node(tmp_path, "node1", [2], {2: 1})
    records.write_heartbeat(node1, 3, {"time": 1.0, "phase": "training", "where": "train.py:9 in step"})
    node0 = _node(tmp_path, "node0", [0, 1], {})
    # node 1: rank 2 failed and saw rank 3's process gone without an ending (SIGKILL)
    seen = endings.exchange(node1, 2, failed=True, gone={3: {"pid": 999999, "where": "train.py:9 in step"}},
                            env=store_env)
    assert seen.ended == {2: "failed", 3: "gone"} and not seen.complete
    # node 0: rank 1 ended well, not last: nothing copied, the job has not ended
    first = endings.exchange(node0, 1, failed=False, env=store_env)
    assert not first.complete and first.copied == [] and first.running() == [0]
    last = endings.exchange(node0, 0, failed=False, env=store_env)
    assert last.complete and sorted(last.copied) == [2, 3]
    out = records.read_outcomes(node0)
    assert out[2]["exit_code"] == 1 and out[2]["remote"] is True
    gone = endings.remote_gone(node0)
    assert list(gone) == [3] and gone[3]["seen_by"] == 2 and gone[3]["where"] == "train.py:9 in step"


def test_the_preflights_report_goes_with_its_ranks_ending_so_every_node_keeps_its_findings(tmp_path, store_env):
    node0 = _node(tmp_path, "node0", [0, 1], {})
    node1 = _node(tmp_path, "node1", [2, 3], {})
    pf = {"status": "warn", "findings": [{"id": "DDP407"}], "measurements": {"clock_offset_s": {"0": 0.0, "2": 0.5}}}
    records.write_json(records.preflight_record_path(node0, 0), pf)
    for d, r in ((node0, 0), (node0, 1), (node1, 2)):
        endings.exchange(d, r, failed=False, env=store_env)
    last = endings.exchange(node1, 3, failed=False, env=store_env)  # the last to end: on node 1
    assert last.complete and sorted(last.copied) == [0, 1]
    with open(records.preflight_record_path(node1, 0), encoding="utf-8") as f:
        assert json.load(f) == pf
    assert not os.path.exists(records.preflight_record_path(node1, 1))  # rank 1 made none


def test_rank_0_waits_a_bounded_moment_and_says_which_ranks_still_run(tmp_path, store_env):
    node0 = _node(tmp_path, "node0", [0, 1], {})
    endings.exchange(node0, 1, failed=False, env=store_env)
    job = endings.exchange(node0, 0, failed=False, env=store_env)
    assert not job.complete
    job = endings.wait_for_job(node0, job, 0.6, env=store_env)
    assert not job.complete and job.running() == [2, 3] and job.copied == []
    assert set(records.read_outcomes(node0)) == {0, 1}  # nothing of the other node's was made up


class _Watched:
    """A store client that notes when it is asked to wait and how often the list of endings is read."""

    def __init__(self, inner, waiting):
        self.inner, self.waiting, self.list_reads = inner, waiting, 0

    def wait(self, keys, *rest):
        self.waiting.set()
        return self.inner.wait(keys, *rest)

    def get(self, key):
        self.list_reads += key.endswith("/ended")
        return self.inner.get(key)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def watched_clients(monkeypatch):
    """(an event set when any client made by endings._connect is asked to wait, those clients)."""
    import threading
    waiting, clients = threading.Event(), []
    connect = endings._connect

    def watched(env, timeout):
        clients.append(_Watched(connect(env, timeout), waiting))
        return clients[-1]

    monkeypatch.setattr(endings, "_connect", watched)
    return waiting, clients


@pytest.mark.parametrize("who", ["failed rank", "rank 0"])
def test_a_rank_waiting_for_the_jobs_end_waits_on_the_stores_side_and_copies_what_came(tmp_path, store_env,
                                                                                       watched_clients, who):
    """A failed rank (and rank 0, ended well) waits for the other ranks' endings in one wait on the
    store, not by reading the list of endings, which grows with the world, over and over; the rank
    whose ending completes the job says so, and the waiting rank then copies every ending."""
    import threading
    waiting, clients = watched_clients
    node0 = _node(tmp_path, "node0", [0, 1], {} if who == "rank 0" else {0: 1})
    node1 = _node(tmp_path, "node1", [2, 3], {})
    if who == "rank 0":
        endings.exchange(node0, 1, failed=False, env=store_env)
        job = endings.exchange(node0, 0, failed=False, env=store_env)
        waiter = threading.Thread(target=lambda: out.append(endings.wait_for_job(node0, job, 60.0, env=store_env)))
    else:
        waiter = threading.Thread(target=lambda: out.append(endings.exchange(node0, 0, failed=True, env=store_env)))
    out: list = []
    waiter.start()
    assert waiting.wait(30), "the rank never waited on the store's side"
    others = [1, 2, 3] if who == "failed rank" else [2, 3]
    for r in others:
        endings.exchange(node0 if r < 2 else node1, r, failed=False, env=store_env)
    waiter.join(30)
    (job,) = out
    assert job.complete and sorted(job.copied) == [2, 3], (job.ended, job.copied)
    assert records.read_outcomes(node0)[3]["remote"] is True
    assert clients[0 if who == "failed rank" else 2].list_reads <= 2  # before and after its one wait


def test_without_a_store_nothing_is_known_and_nothing_raises(tmp_path):
    env = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}  # no MASTER_ADDR/PORT
    job = endings.exchange(str(tmp_path), 0, failed=False, env=env)
    assert job.world == 0 and not job.complete
    assert endings.wait_for_job(str(tmp_path), job, 5.0, env=env) is job


def test_the_wait_is_bounded_and_read_from_the_environment():
    assert endings.job_end_wait({}) == endings.JOB_END_WAIT
    assert endings.job_end_wait({endings.JOB_END_WAIT_ENV: "2.5"}) == 2.5
    assert endings.job_end_wait({endings.JOB_END_WAIT_ENV: "1e308"}) == 3600.0
    assert endings.job_end_wait({endings.JOB_END_WAIT_ENV: "soon"}) == endings.JOB_END_WAIT


def test_a_hang_shared_across_nodes_survives_a_first_connection_that_fails(tmp_path, store_env, monkeypatch):
    """At a hang each node's rank posts its ending and copies the other node's. A first connection
    to the store that fails (a loaded host past the store's 1 s bound) is tried again within the
    share's bound, so the node's report still gets the other node's rank and its stack."""
    import threading

    env = {**store_env, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
    node0, node1 = str(tmp_path / "node0"), str(tmp_path / "node1")
    for d, r in ((node0, 0), (node1, 1)):
        os.makedirs(d)
        records.write_heartbeat(d, r, {"time": 1.0, "phase": "training"})
    # rank 0's ledger as its watchdog leaves it at a hang: waiting in all_reduce
    records.write_ledger(node0, 0, {"position": "hung", "steps": 3, "where": "train.py:14 in <module>",
                                    "entries": [{"profiling_name": "gloo:all_reduce", "retired": False}]})
    real, failed = endings._connect, []

    def first_fails(e, timeout):
        if e.get("FAIL_FIRST") and not failed:
            failed.append(1)
            raise endings_store_timeout()
        return real(e, timeout)

    monkeypatch.setattr(endings, "_connect", first_fails)
    waiting = endings.HangExchange(node0, 0, env=env)
    out: list = []
    t = threading.Thread(target=lambda: out.append(waiting.share("train.py:14 in <module>", "in all_reduce")))
    t.start()
    blocked = endings.HangExchange(node1, 1, env={**env, "FAIL_FIRST": "1"})
    assert blocked.share("train.py:12 in <module>", "batches.get()") == [0] and failed == [1]
    assert "StoreTimeout" in (blocked.last_error or "")
    t.join(endings.HANG_SHARE_WAIT + 5)
    assert out == [[1]]
    hung = endings.remote_hung(node1)
    assert list(hung) == [0] and hung[0]["where"] == "train.py:14 in <module>" and hung[0]["in_collective"]
    with open(records.stack_path(node1, 0), encoding="utf-8") as f:
        assert f.read() == "in all_reduce"


def test_a_stalled_rank_watches_for_another_nodes_hang_in_one_wait_on_the_stores_side(tmp_path, store_env,
                                                                                       watched_clients):
    """A rank stalled on node 1 learns that node 0 found the job hung through one wait that the
    store answers when node 0 asks, not a look every few seconds by every stalled rank of the job."""
    from helpers.procs import wait_for
    env = {**store_env, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
    waiting, clients = watched_clients
    node1 = str(tmp_path / "node1")
    os.makedirs(node1)
    stalled = endings.HangExchange(node1, 1, env=env)
    assert stalled.asked(100.0) is False
    assert waiting.wait(30), "the rank never waited on the store's side"
    for now in (101.0, 103.0, 106.0):  # the watchdog's later ticks read what the watch saw
        assert stalled.asked(now) is False
    torch_dist.TCPStore("127.0.0.1", int(env["MASTER_PORT"]), is_master=False).set(
        f"{endings._prefix(env)}/hang/asked", "1")  # node 0 found the job hung
    wait_for(lambda: stalled.asked(110.0), 30, "the stalled rank to see the other node's hang")
    assert len(clients) == 1 and clients[0].list_reads == 0


@pytest.mark.slow
def test_a_hang_shared_with_no_store_to_meet_at_copies_nothing_and_says_why(tmp_path, capsys, monkeypatch):
    """No store answers (the master node is gone): the share gives up at its bound, copies
    nothing, says so on stderr, and still writes the file its node's parent waits for."""
    monkeypatch.setattr(endings, "HANG_SHARE_WAIT", 2.0)  # the bound given up at (6 s), shorter
    from helpers.procs import free_port
    node1 = str(tmp_path / "node1")
    os.makedirs(node1)
    records.write_heartbeat(node1, 1, {"time": 1.0, "phase": "training"})
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
    assert endings.HangExchange(node1, 1, env=env).share("train.py:12", "stack") == []
    assert "could not read the other nodes' ranks" in capsys.readouterr().err
    assert os.path.exists(records.hang_shared_path(node1, 1))


def endings_store_timeout():
    from ddp_doctor.processes.tcp_store import StoreTimeout
    return StoreTimeout("no store answered within 3 s (injected)")


def test_a_failed_rank_stopped_before_it_shared_its_ending_shares_it_and_its_vanished_peer(tmp_path, store_env,
                                                                                          monkeypatch):
    """The launcher's SIGTERM can reach a rank after its script failed (its outcome written) and
    before the main thread put that ending, and the peer of its node it saw gone, in the job's
    store: the stop handler's exit would cut that short, and the other nodes would never learn
    that rank 3 was killed (DDP802 instead of DDP803 there). The stop handler shares them first."""
    import signal
    import subprocess
    import sys
    import time
    from types import SimpleNamespace

    from ddp_doctor.training.run import stopped_rank
    for k, v in store_env.items():
        monkeypatch.setenv(k, v)
    started = time.time()
    node1 = str(tmp_path / "node1")
    os.mkdir(node1)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    records.write_heartbeat(node1, 3, {"time": started, "phase": "training", "pid": int(dead.stdout),
                                       "where": "train.py:9 in step"})
    records.write_outcome(node1, 2, {"exit_code": 1, "exception": {"type": "RuntimeError",
                                                                     "message": "Connection closed by peer"}})
    reported, exits = [], []

    class Exited(BaseException):
        pass

    def _exit(code):
        exits.append(code)
        raise Exited

    node0 = _node(tmp_path, "node0", [0, 1], {0: 1, 1: 1})
    for r in (0, 1):  # node 0's ranks failed with a lost peer and shared that
        endings.exchange(node0, r, failed=False, env=store_env)
    monkeypatch.setattr(stopped_rank, "write_outside_report", lambda *a, **k: reported.append(a[:2]))
    monkeypatch.setattr(stopped_rank.os, "_exit", _exit)
    watch = SimpleNamespace(run_dir=node1, rank=2, job_since=started - 60, claim_stop=lambda: True)
    with pytest.raises(Exited):
        stopped_rank.end_stopped_rank(watch, signal.SIGTERM, started, SimpleNamespace())
    assert exits == [1] and reported == [(2, node1)]
    assert set(records.read_outcomes(node1)) == {0, 1, 2}  # node 0's endings copied for its report
    seen = endings.exchange(node0, 0, failed=True, env=store_env)
    assert seen.complete and seen.ended == {0: "ok", 1: "ok", 2: "failed", 3: "gone"}, seen.ended
    assert list(endings.remote_gone(node0)) == [3]
