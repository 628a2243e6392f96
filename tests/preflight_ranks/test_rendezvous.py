"""Bounded rendezvous: master probes (ok / refused / unresolvable / timeout), ports, store meeting.

Only loopback traffic is used. The dropped-SYN (timeout) case runs in a private network namespace
(`unshare --net`, needs root) with a firewall rule dropping TCP to one loopback port; it needs the
`iptables` (or `nftables`) package and is skipped when that or the namespace is not available.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Iterator

import pytest
from helpers.procs import free_port

from ddp_doctor.checks import rendezvous as ev
from ddp_doctor.preflight_ranks import bounded_rendezvous as rendezvous
from ddp_doctor.preflight_ranks.bounded_rendezvous import Meeting, Reach
from ddp_doctor.processes.tcp_store import prefixed, read_json_keys
from ddp_doctor.version import __version__


@pytest.fixture
def listening() -> Iterator[tuple[socket.socket, int]]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    try:
        yield s, s.getsockname()[1]
    finally:
        s.close()


# ---------------------------------------------------------------- reach_master

def test_probe_listening_socket_is_ok(listening: tuple[socket.socket, int]) -> None:
    _, port = listening
    probe = rendezvous.reach_master("127.0.0.1", port, 30.0, check_store=False)  # TCP only: no store
    assert probe.ok and probe.kind == "" and probe.attempts == 1  # the first attempt: no wait, no retry


def test_probe_localhost_name_is_ok(listening: tuple[socket.socket, int]) -> None:
    # torchrun's own MASTER_ADDR for --standalone is "localhost"; ::1 may be tried first and refused
    _, port = listening
    assert rendezvous.reach_master("localhost", port, 30.0, attempt_timeout=0.5, check_store=False).ok


class Clock:
    """rendezvous's clock, stood in for (`monkeypatch.setattr(rendezvous, "time", Clock())`): time
    passes only when the probe sleeps between attempts (a refused connection takes none), so how
    long the probe went on is exact, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_probe_nothing_listening_is_refused_within_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    clock = Clock()
    monkeypatch.setattr(rendezvous, "time", clock)
    probe = rendezvous.reach_master("127.0.0.1", port, 0.6, attempt_timeout=0.3)
    assert not probe.ok
    assert probe.kind == "refused"
    assert f"127.0.0.1:{port}" in probe.detail
    assert probe.attempts >= 2  # retried: the master may still be starting
    # retried for exactly its bound, and no longer: the pauses between attempts fill the 0.6 s
    assert probe.elapsed_s == pytest.approx(0.6) and sum(clock.sleeps) == pytest.approx(0.6)
    assert len(clock.sleeps) == probe.attempts and all(0 < s <= 0.2 for s in clock.sleeps)
    f = ev.unreachable_finding(probe, "127.0.0.1", port, 0.6, 1)
    assert f.id == "DDP311" and f.evidence["bound_s"] == 0.6 and f.evidence["elapsed_s"] == 0.6


def test_probe_refused_then_master_appears(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    class StartsTheMaster:
        """The real clock; the probe's first pause (after its first refused attempt) is when the
        master starts listening."""
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            if srv.fileno() >= 0 and not srv.getsockname()[1]:
                srv.bind(("127.0.0.1", port))
                srv.listen(1)
            time.sleep(seconds)

    monkeypatch.setattr(rendezvous, "time", StartsTheMaster)
    try:
        probe = rendezvous.reach_master("127.0.0.1", port, 30.0, attempt_timeout=0.3, check_store=False)
    finally:
        srv.close()
    assert probe.ok and probe.attempts == 2  # refused once, then the master was there


def test_probe_unresolvable_name() -> None:
    probe = rendezvous.reach_master("ddp-doctor-test-host.invalid", 29500, 2.0)
    assert not probe.ok
    assert probe.kind == "unresolvable"
    assert probe.attempts == 0
    assert "no answer from the resolver" not in probe.detail  # the resolver said no: no wait for the bound


# ---------------------------------------------------------------- dropped SYN (timeout) in a netns

def _netns_available() -> str | None:
    """Why the namespace tests cannot run here, or None when they can."""
    if not sys.platform.startswith("linux"):
        return "Linux only"
    if os.geteuid() != 0:
        return "needs root for unshare --net"
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    try:
        p = subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare --net failed: {e}"
    if p.returncode != 0:
        return f"unshare --net failed: {p.stderr.decode(errors='replace').strip()}"
    return None


def _drop_rule(port: int) -> str | None:
    """A shell command that drops TCP to loopback `port` in the current namespace."""
    if shutil.which("iptables"):
        return f"iptables -A INPUT -p tcp --dport {port} -j DROP"
    if shutil.which("nft"):
        return ("nft add table inet ddpdoctor && "
                "nft add chain inet ddpdoctor input '{ type filter hook input priority 0; }' && "
                f"nft add rule inet ddpdoctor input tcp dport {port} drop")
    return None


PROBE_SCRIPT = """
import json, sys, time
from ddp_doctor.checks import rendezvous as ev
from ddp_doctor.preflight_ranks import bounded_rendezvous as rendezvous
host, port, bound = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
p = rendezvous.reach_master(host, port, bound, attempt_timeout=0.4)
f = ev.unreachable_finding(p, host, port, bound, 1)
print(json.dumps({"ok": p.ok, "kind": p.kind, "attempts": p.attempts, "detail": p.detail,
                  "id": f.id, "message": f.message, "ranks": f.ranks, "evidence": f.evidence}))
"""


def _run_in_netns(setup: str, port: int, bound: float) -> dict[str, Any]:
    cmd = f"{setup} && exec {sys.executable} -c \"$0\" 127.0.0.1 {port} {bound}" if setup else \
        f"exec {sys.executable} -c \"$0\" 127.0.0.1 {port} {bound}"
    p = subprocess.run(["unshare", "--net", "sh", "-c", cmd, PROBE_SCRIPT], capture_output=True, text=True,
                       timeout=30)
    if p.returncode != 0:
        pytest.skip(f"could not run the probe in a network namespace: {p.stderr.strip()[-500:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_probe_dropped_syn_is_timeout_within_bound() -> None:
    why = _netns_available()
    if why:
        pytest.skip(why)
    port = 29555
    rule = _drop_rule(port)
    if rule is None:
        pytest.skip("needs iptables or nft (apt-get install iptables)")
    out = _run_in_netns(f"ip link set lo up && {rule}", port, 1.0)
    assert out["ok"] is False
    assert out["kind"] == "timeout", out
    assert f"127.0.0.1:{port}" in out["detail"]
    assert out["attempts"] >= 2  # 0.4 s attempts inside a 1 s bound
    # it tried until its 1 s bound was used up (the probe leaves its loop only there)
    assert out["evidence"]["bound_s"] == 1.0 and out["evidence"]["elapsed_s"] >= 1.0
    assert out["id"] == "DDP312"
    assert f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port}" in out["message"]
    assert out["ranks"] == [1]


@pytest.mark.slow
def test_probe_network_unreachable_in_netns() -> None:
    # a fresh namespace with loopback down: even 127.0.0.1 has no route
    why = _netns_available()
    if why:
        pytest.skip(why)
    out = _run_in_netns("", 29556, 0.5)
    assert out["ok"] is False
    assert out["kind"] == "unreachable", out
    assert out["evidence"]["bound_s"] == 0.5 and out["evidence"]["elapsed_s"] >= 0.5  # ended by its bound
    assert out["id"] == "DDP312"  # no separate ID: reported like a timeout (packets go nowhere)


# ---------------------------------------------------------------- unreachable_finding

@pytest.mark.parametrize("kind,cid", [("unresolvable", "DDP310"), ("refused", "DDP311"), ("timeout", "DDP312"),
                                      ("unreachable", "DDP312")])
def test_probe_finding_maps_kinds(kind: str, cid: str) -> None:
    probe = Reach(ok=False, kind=kind, detail="some detail", attempts=3, elapsed_s=1.23456)
    f = ev.unreachable_finding(probe, "algo-2", 7777, 5.0, 3)
    assert f.id == cid and f.severity == "error" and f.category == "network"
    assert "MASTER_ADDR=algo-2 MASTER_PORT=7777" in f.message
    assert f.ranks == [3]
    assert f.evidence["master_addr"] == "algo-2" and f.evidence["master_port"] == 7777
    assert f.evidence["attempts"] == 3 and f.evidence["elapsed_s"] == 1.235 and f.evidence["bound_s"] == 5.0
    assert f.hint  # the catalogue's Fix
    if kind == "timeout":
        assert "security group" in f.hint and "5 s" in f.message
    if kind == "refused":
        assert "3 attempts" in f.message


def test_probe_finding_end_to_end_refused() -> None:
    port = free_port()
    probe = rendezvous.reach_master("127.0.0.1", port, 0.3, attempt_timeout=0.2)
    f = ev.unreachable_finding(probe, "127.0.0.1", port, 0.3, 0)
    assert f.id == "DDP311" and f"MASTER_PORT={port}" in f.message


# ---------------------------------------------------------------- ports and hosts

def test_port_in_use(listening: tuple[socket.socket, int]) -> None:
    _, port = listening
    err = rendezvous.port_in_use(port)
    assert err is not None and "in use" in err.lower()


def test_port_free() -> None:
    assert rendezvous.port_in_use(free_port()) is None


def test_is_local_host() -> None:
    assert rendezvous.is_local_host("127.0.0.1") is True
    assert rendezvous.is_local_host("localhost") is True
    assert rendezvous.is_local_host(socket.gethostname()) in (True, None)
    assert rendezvous.is_local_host("ddp-doctor-test-host.invalid") is None


def test_local_addresses_include_loopback() -> None:
    assert {"127.0.0.1", "::1"} <= rendezvous.local_addresses()


# ---------------------------------------------------------------- meeting at a real TCPStore

@pytest.fixture
def store() -> Iterator[Any]:
    import torch.distributed as dist
    s = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=5), wait_for_workers=False)
    try:
        yield s
    finally:
        del s


def client_of(master: Any) -> Any:
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", master.port, None, False, timedelta(seconds=5))


def view(rank: int) -> dict[str, Any]:
    return {"rank": rank, "hostname": "test-host", "pid": 1000 + rank}


def test_meet_single_rank_is_complete(store: Any) -> None:
    m = rendezvous.meet(prefixed(store, "t1/"), 0, 1, view(0), 2.0)
    assert isinstance(m, Meeting)
    assert m.complete and m.arrived == [0] and m.missing == [] and m.findings == []
    assert m.reporter == 0
    assert rendezvous.read_views(prefixed(store, "t1/"), [0, 9], time.monotonic() + 0.2) == {0: view(0)}


def test_meet_sends_the_text_the_rank_made_with_its_view(store: Any) -> None:
    """A rank makes its view's text as it makes the view (before it reaches the store): meet sends
    it after its claim's token, and the views read back are what the ranks made."""
    s = prefixed(store, "t1b/")
    made = view(0) | {"env": {f"NCCL_SETTING_{i}": "value" for i in range(30)}}
    text = rendezvous.view_text(made)
    assert text.count("\n") == 1  # the short values, then the long one on a line of its own
    met = rendezvous.meet(s, 0, 1, made, 2.0, text)
    assert met.complete and met.views == {0: made}  # rank 0 read every view at the meeting
    token, sent = s.get("view/0").decode().split("\n", 1)
    assert sent == text and token
    assert rendezvous.read_views(s, [0], time.monotonic() + 1.0, present=True) == {0: made}


def test_meet_with_missing_rank_is_bounded(store: Any) -> None:
    m = rendezvous.meet(prefixed(store, "t2/"), 0, 2, view(0), 0.5)
    assert not m.complete and m.arrived == [0] and m.missing == [1]
    [f] = m.findings
    assert f.id == "DDP320"
    assert f.ranks == [1]
    assert f.evidence["arrived"] == [0] and f.evidence["missing"] == [1] and f.evidence["world_size"] == 2
    # ended by its 0.5 s bound: one check-in of the two it waited for
    assert f.evidence["timeout_s"] == 0.5 and f.evidence["check_ins"] == 1 and "within 0.5 s" in f.message
    assert "WORLD_SIZE=2" in f.message and "arrived 0" in f.message and "missing 1" in f.message


def test_meet_two_ranks_through_the_store(store: Any) -> None:
    client = client_of(store)
    results: dict[int, Meeting] = {}

    def go(s: Any, rank: int) -> None:
        results[rank] = rendezvous.meet(prefixed(s, "t3/"), rank, 2, view(rank), 60.0)

    threads = [threading.Thread(target=go, args=(store, 0)), threading.Thread(target=go, args=(client, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [0, 1], "a rank never returned from the meeting"
    # nobody waited for the bound: both checked in, so rank 0 said so, which ended the other's wait
    assert prefixed(store, "t3/").check([rendezvous.ALL_HERE])
    for r in (0, 1):
        assert results[r].complete and results[r].arrived == [0, 1] and results[r].findings == []
        assert results[r].reporter == 0


class Counted:
    """A store client, noting the requests a rank sends (by name)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.requests, self.sizes = inner, [], []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        def call(*args: Any) -> Any:
            self.requests.append(name)
            self.sizes.append(len(args[0]) if args and isinstance(args[0], list) else 1)  # keys asked for
            return method(*args)
        return call


def test_meet_costs_each_rank_the_round_trips_of_a_store_barrier(store: Any) -> None:
    """Every rank claims its rank and puts its view in one request, and waits once: two requests,
    as a plain barrier's add and wait; rank 0 waits for the views (a chunk at a time: here one) and reads them,
    and one key more says they are all there. Nothing is polled."""
    clients = {r: Counted(prefixed(store if r == 0 else client_of(store), "t12/")) for r in range(4)}
    results: dict[int, Meeting] = {}
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(
        r, rendezvous.meet(clients[r], r, 4, view(r), 60.0))) for r in (3, 1, 2, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [0, 1, 2, 3] and all(m.complete and not m.findings for m in results.values())
    assert clients[0].requests == ["compare_set", "wait", "multi_get", "set"]
    assert results[0].views == {r: view(r) for r in range(4)} and all(not results[r].views for r in (1, 2, 3))
    for r in (1, 2, 3):
        assert clients[r].requests == ["compare_set", "wait"], (r, clients[r].requests)
    quiet = Counted(prefixed(store, "t12/"))
    assert rendezvous.crowd(quiet, 4, 5.0) is None and quiet.requests == ["add", "check"]  # no crowd: two requests


@pytest.mark.slow
def test_rank_0_reads_the_views_a_chunk_at_a_time_as_they_come(store: Any, monkeypatch: Any) -> None:
    """Rank 0 waits for the views READ_CHUNK ranks at a time and reads each chunk once it is all
    there, while later ranks still come: once the last is in, only its chunk is left to read. A
    chunk that never completes ends the meeting at the deadline with the views of the chunks that
    came whole, and the reporter reads the others' afterwards."""
    monkeypatch.setattr(rendezvous, "READ_CHUNK", 2)
    s = prefixed(store, "t14/")
    for r in (1, 2, 3, 4):  # the other ranks' check-ins, before rank 0's
        s.set(f"view/{r}", rendezvous.view_record(f"other-{r}", rendezvous.view_text(view(r))))
    zero = Counted(s)
    met = rendezvous.meet(zero, 0, 5, view(0), 5.0)
    assert met.complete and met.views == {r: view(r) for r in range(5)}
    assert zero.requests == ["compare_set"] + ["wait", "multi_get"] * 3 + ["set"], zero.requests
    assert [n for q, n in zip(zero.requests, zero.sizes) if q == "wait"] == [2, 2, 1]  # ranks 0-1, 2-3, 4
    t = prefixed(store, "t15/")  # rank 3 never comes: ranks 0-1 read, 2-3 never whole, 4 not waited for
    for r in (1, 2, 4):
        t.set(f"view/{r}", rendezvous.view_record(f"other-{r}", rendezvous.view_text(view(r))))
    cut = rendezvous.meet(t, 0, 5, view(0), 1.0)
    assert cut.missing == [3] and sorted(cut.views) == [0, 1]
    assert rendezvous.read_views(t, [r for r in cut.arrived if r not in cut.views], time.monotonic() + 1.0,
                                 present=True) == {2: view(2), 4: view(4)}
    u = prefixed(store, "t16/")  # a record that is no view: the others are read and released all the same
    for r in (1, 2):
        u.set(f"view/{r}", rendezvous.view_record(f"other-{r}", rendezvous.view_text(view(r))))
    u.set("view/3", "not json")
    bad = rendezvous.meet(u, 0, 4, view(0), 5.0)
    assert bad.complete and sorted(bad.views) == [0, 1, 2] and u.check([rendezvous.ALL_HERE])


@pytest.mark.slow
def test_views_are_read_back_as_made_with_each_alike_long_value_parsed_once(store: Any) -> None:
    """Long values alike on many ranks (versions, NCCL settings) have lines of their own in a view's
    record: the reporting rank reads every view in one request and parses each distinct long value
    once (its own never), and gets every view as made."""
    s = prefixed(store, "t13/")
    env = {f"NCCL_SETTING_{i}": "value" for i in range(30)}
    views = {r: view(r) | {"env": env if r != 2 else {**env, "NCCL_SETTING_0": "other"},
                          "versions": {"torch": "2.13.0"}, "findings": []} for r in range(4)}
    for r, v in views.items():
        s.set(f"view/{r}", rendezvous.view_record(f"claim-{r}", rendezvous.view_text(v)))
    assert rendezvous.read_views(s, [0, 1, 2, 3, 7], time.monotonic() + 1.0) == views  # 7 never came
    known = Counted(s)  # the ranks a meeting found there: read at once, with no wait for them first
    own = rendezvous.view_text(views[0])
    reader = rendezvous.ViewReader(own)
    mine = next(iter(reader.parts.values()))  # the reader's own long value, parsed as it was made
    got = reader.read(known, [0, 1, 2, 3], time.monotonic() + 1.0, present=True)
    assert got == views and known.requests == ["multi_get"], known.requests
    assert got[0]["env"] is got[1]["env"] is got[3]["env"] is mine  # alike: the reader's own copy, never parsed
    assert got[2]["env"] is not mine and len(reader.parts) == 2  # rank 2's differ: parsed once, kept
    again = reader.read(known, [2, 3], time.monotonic() + 1.0, present=True)
    assert again[2]["env"] is got[2]["env"]  # one reader over several reads: each distinct value parsed once in all
    token, short, long = s.get("view/0").decode().split("\n")  # the claim, the short values, a long one
    small = json.loads(short)
    assert token == "claim-0" and small["versions"] == {"torch": "2.13.0"} and small["env"] is None
    assert small[rendezvous.PARTS] == ["env"] and list(small)[:-1] == list(views[0])  # the view's keys in order
    assert json.loads(long) == env
    with pytest.raises(ValueError):  # a record whose lines do not match its keys is no view
        rendezvous.parse_record(f"t\n{short}", {})


def test_a_rank_whose_record_is_no_view_is_named_and_left_out_of_the_views(store: Any) -> None:
    """DDP325: a rank that checked in with a record this reader cannot read (here: a view as an
    older ddp-doctor put it, plain JSON with no claim token) is left out of the views and named,
    with why; the others' views are read as made. No such rank: no finding."""
    s = prefixed(store, "t17/")
    ranks = {r: threading.Thread(target=rendezvous.meet, args=(prefixed(client_of(store), "t17/"), r, 4, view(r), 30.0))
             for r in (2, 3)}
    for t in ranks.values():
        t.start()
    s.set("view/1", json.dumps(view(1)))  # rank 1, as another version put its view
    met = rendezvous.meet(s, 0, 4, view(0), 30.0)
    for t in ranks.values():
        t.join(60)
    assert met.complete and sorted(met.views) == [0, 2, 3]  # every rank came; rank 1's view unread
    reader = rendezvous.ViewReader(rendezvous.view_text(view(0)))
    assert reader.read(s, [0, 1, 2, 3], time.monotonic() + 1.0, present=True) == {r: view(r) for r in (0, 2, 3)}
    assert list(reader.unreadable) == [1] and "not a view record" in reader.unreadable[1]
    f = ev.unreadable_finding(reader.unreadable, 0, __version__)
    assert f is not None and f.id == "DDP325" and f.ranks == [1] and f.severity == "error"
    assert "rank(s) 1 checked in at the rendezvous, but what they put in the store is no view this ddp-doctor" \
        in f.message and "not a view record" in f.message, f.message
    assert "pip show ddp-doctor" in (f.hint or "")
    clean = rendezvous.ViewReader()
    assert clean.read(s, [0, 2, 3], time.monotonic() + 1.0, present=True) and not clean.unreadable
    assert ev.unreadable_finding(clean.unreadable, 0, __version__) is None


@pytest.mark.slow
def test_duplicate_rank_claim(store: Any) -> None:
    client = client_of(store)
    results: list[Meeting] = []
    lock = threading.Lock()

    def go(s: Any) -> None:
        m = rendezvous.meet(prefixed(s, "t4/"), 0, 2, view(0), 1.0)
        with lock:
            results.append(m)

    threads = [threading.Thread(target=go, args=(store,)), threading.Thread(target=go, args=(client,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 2
    dup = [f for m in results for f in m.findings if f.id == "DDP322"]
    assert len(dup) == 1
    assert dup[0].evidence == {"rank": 0, "claims": 2, "first": {"pid": 1000, "host": "test-host"}}
    assert "RANK=0 was claimed by 2 processes" in dup[0].message
    # the second claim means rank 1 never came: both see it missing
    for m in results:
        assert m.missing == [1]
        assert any(f.id == "DDP320" for f in m.findings)


def test_claim_tokens_differ_between_claims_threads_and_a_forked_child() -> None:
    """A claim's token tells its claimant apart from every other claimant of the rank: made with no
    system call (a count in this process's random name), so a forked child, which starts with its
    parent's count, must name its claims apart."""
    seen: list[str] = []
    threads = [threading.Thread(target=lambda: seen.extend(rendezvous.claim_token() for _ in range(200)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    seen.append(rendezvous.claim_token())
    assert len(seen) == len(set(seen)) == 801
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next token, then gone, whatever happens (never back into pytest)
        try:
            os.write(write, rendezvous.claim_token().encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        child = os.read(read, 200).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert child and child != rendezvous.claim_token() and child.split(".")[0] != seen[0].split(".")[0]


@pytest.mark.slow
def test_read_json_keys_waits_on_the_store_for_late_keys_without_polling(store: Any) -> None:
    import threading
    s = prefixed(store, "t5/")

    class Counted:
        """The store, counting the requests a reader sends."""
        requests: list[str] = []

        def __getattr__(self, name: str) -> Any:
            method = getattr(s, name)

            def call(*args: Any) -> Any:
                self.requests.append(name)
                return method(*args)
            return call

    reader = Counted()
    other = prefixed(client_of(store), "t5/")  # another rank: its own connection
    # the key is written once the reader is waiting for it (its wait is the first request it sends)
    from helpers.procs import wait_for
    writer = threading.Thread(target=lambda: (wait_for(lambda: reader.requests, 10.0, "the reader's first request"),
                                              other.set("final/1", json.dumps({"x": 1}))))
    writer.start()
    got = read_json_keys(reader, ["final/1"], time.monotonic() + 60.0)
    writer.join(10)
    assert got == {"final/1": {"x": 1}}
    assert reader.requests == ["wait", "multi_get"]  # one wait on the store's side, one read: no polling
    # a key that never comes: one wait to the deadline; then what is there is read
    other.set("final/3", json.dumps(3))
    reader.requests.clear()
    assert read_json_keys(reader, ["final/3", "final/4"], time.monotonic() + 2.5) == {"final/3": 3}
    assert reader.requests.count("wait") == 1, reader.requests


# ---------------------------------------------------------------- two jobs at one store (DDP846)

def test_a_second_claimant_is_no_member_and_the_store_counts_it_as_a_crowd(store: Any) -> None:
    """Two jobs' processes at one MASTER_ADDR:MASTER_PORT: the second claimant of rank 1 leaves
    the first one's view alone and makes the store a crowd, which every rank reads as DDP846."""
    s = prefixed(store, "t6/")
    results: dict[int, Meeting] = {}

    def go(st: Any, key: int, rank: int) -> None:
        results[key] = rendezvous.meet(prefixed(st, "t6/"), rank, 2, view(rank) | {"pid": key}, 30.0)

    first = [threading.Thread(target=go, args=(store, 10, 0)),
             threading.Thread(target=go, args=(client_of(store), 11, 1))]
    for t in first:
        t.start()
    for t in first:
        t.join(60)
    assert rendezvous.crowd(s, 2, 5.0) is None  # exactly the world: no crowd
    go(client_of(store), 12, 1)  # a process of another job, as rank 1 too
    assert [f.id for f in results[12].findings] == ["DDP322"] and not results[12].missing
    assert rendezvous.read_views(s, [1], time.monotonic() + 1.0)[1]["pid"] == 11  # the first claimant's view stands
    assert "the first on host test-host, pid 11" in results[12].findings[0].message
    assert results[12].findings[0].evidence["first"] == {"pid": 11, "host": "test-host"}
    c = rendezvous.crowd(s, 2, 5.0)
    assert c is not None and (c.members, c.extra, c.processes) == (2, 1, 3)
    f = ev.shared_rendezvous_finding(c, "127.0.0.1", 29500, 0)
    assert f.id == "DDP846" and f.ranks == [1] and f.severity == "error"
    assert "3 processes met at the rendezvous on MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 for WORLD_SIZE=2" \
        in f.message
    assert "rank 1: pid 11 on host test-host, pid 12 on host test-host" in f.message, f.message
    assert "MASTER_PORT" in (f.hint or "")


def test_ranks_of_a_larger_world_at_this_store_make_a_crowd(store: Any) -> None:
    """Two jobs at one port, the second one larger: its ranks past the first's world claim ranks
    nobody else claims, so no claim is doubled; the store still holds more processes than the
    first world has ranks, and that world's ranks read a crowd."""
    s = prefixed(store, "t14/")
    results: dict[int, Meeting] = {}
    clients = {0: store, 1: client_of(store)}
    first = [threading.Thread(target=lambda r=r: results.__setitem__(
        r, rendezvous.meet(prefixed(clients[r], "t14/"), r, 2, view(r), 30.0))) for r in (0, 1)]
    for t in first:
        t.start()
    for t in first:
        t.join(60)
    assert sorted(results) == [0, 1] and rendezvous.crowd(s, 2, 5.0) is None
    # rank 2 of a job of 4 (its ranks 0 and 1 elsewhere or late): it finds "all here" said by the
    # first job's rank 0, and is no duplicate
    later = rendezvous.meet(prefixed(client_of(store), "t14/"), 2, 4, view(2), 5.0)
    assert not later.findings
    c = rendezvous.crowd(s, 2, 5.0)
    assert c is not None and (c.members, c.extra) == (3, 0)
    f = ev.shared_rendezvous_finding(c, "127.0.0.1", 29500, 0)
    assert "3 processes met at the rendezvous" in f.message and "for WORLD_SIZE=2" in f.message, f.message


def test_a_rank_0_that_could_not_host_is_counted_where_another_jobs_rendezvous_runs(store: Any) -> None:
    s = prefixed(store, "t7/")
    rendezvous.meet(s, 0, 1, view(0), 5.0)  # that job's rank 0 is there
    who = {"rank": 0, "pid": 4242, "host": "test-host", "why": ev.COULD_NOT_HOST}
    seen = rendezvous.announce("127.0.0.1", store.port, "t7/", who, 2, bound=5.0)
    assert seen is not None and seen.extra == 1
    f = ev.shared_rendezvous_finding(seen, "127.0.0.1", store.port, 0)
    assert "pid 1000 on host test-host, pid 4242 on host test-host (could not host the store: the port was taken)" \
        in f.message, f.message
    assert rendezvous.crowd(s, 1, 5.0) is not None  # that job's ranks now read a crowd and fail too
    # no rendezvous of ours in the store that holds the port: only the port in use is said
    assert rendezvous.announce("127.0.0.1", store.port, "t8/", who, 2, bound=0.5) is None


@pytest.mark.slow
def test_announce_at_a_port_that_no_store_holds_is_bounded_and_says_nothing(
        listening: tuple[socket.socket, int]) -> None:
    _, port = listening  # accepts, never answers: torch's handshake would wait forever
    assert rendezvous.announce("127.0.0.1", port, "t9/", {"rank": 0}, 2, bound=0.5) is None


def test_every_rank_agrees_on_one_job_token(store: Any) -> None:
    s = prefixed(store, "t10/")
    tokens = {rendezvous.agree_job_token(prefixed(st, "t10/"), 5.0) for st in (store, client_of(store))}
    assert len(tokens) == 1 and None not in tokens
    assert rendezvous.agree_job_token(prefixed(store, "t11/"), 5.0) not in tokens  # another job
    assert s.get("job_token").decode() in tokens


def test_present_ranks_finds_the_missing_by_halving_not_one_request_a_rank(store: Any) -> None:
    s = prefixed(store, "t9/")
    for r in range(1024):
        if r not in (5, 700):
            s.set(f"view/{r}", "{}")

    class Counted:
        requests = 0

        def check(self, keys: list[str]) -> bool:
            Counted.requests += 1
            return s.check(keys)

    assert rendezvous.present_ranks(Counted(), 1024, 5.0) == [r for r in range(1024) if r not in (5, 700)]
    assert Counted.requests <= 2 * 2 * 10 + 1, Counted.requests  # about 2k log2(N), far below 1,024
