"""Bounded rendezvous: reach the master, meet the other ranks in the store, say who is missing.

Before any collective, a rank tries MASTER_ADDR:MASTER_PORT with short connection attempts and
classifies a failure (does not resolve / refused / timed out); once the port accepts, torch's own
store client must complete its handshake there, else what holds the port is not a torch store and
the rank says what answered (identify_store). Ranks then check in at the store under a prefix of
ddp-doctor's own; the store, unlike a collective, tells which ranks did arrive.
What is seen here is gathered as facts (checks/rendezvous.py: Reach, Missing, Crowd); the findings
are worded there.
Every wait here ends at a deadline: the store is reached and used through the bounded client
(processes/tcp_store.py), and torch's own handshake, which has no bound, runs through
call_with_time_limit here too.
"""
from __future__ import annotations

import errno
import itertools
import json
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ddp_doctor.checks import rendezvous as ev
from ddp_doctor.checks.rendezvous import MAX_NAMED, Crowd, Reach  # the facts gathered here
from ddp_doctor.findings import Finding
from ddp_doctor.processes.tcp_store import (
    connect_store,
    op_bound,
    prefixed,
    read_json_keys,
    read_keys,
    store_call,
    wait_keys,
)
from ddp_doctor.time_limit import call_with_time_limit

DEFAULT_PORT = 29500


def _resolve(host: str, port: int, bound: float) -> tuple[list[Any] | None, str]:
    """getaddrinfo has no timeout of its own: run it in a thread and give up at the bound."""
    out = call_with_time_limit(lambda: socket.getaddrinfo(host, port, type=socket.SOCK_STREAM), bound,
                               name="ddp-doctor-resolve")
    if not out.finished:
        return None, f"no answer from the resolver within {bound:g} s"
    if out.error is not None:
        return None, str(out.error)
    return out.value, ""


def reach_master(host: str, port: int, bound: float, attempt_timeout: float = 2.0,
                 check_store: bool = True) -> Reach:
    """Try to open a TCP connection to host:port until it works or `bound` seconds pass, then (with
    `check_store`) make sure a torch store answers there, within the same bound.

    Refused and timed-out attempts are retried (the master may still be starting); the last
    error decides the classification."""
    start = time.monotonic()
    deadline = start + bound
    infos, err = _resolve(host, port, min(bound, 10.0))
    if not infos:
        return Reach(False, "unresolvable", err or "no address", 0, time.monotonic() - start)
    attempts, kind, detail = 0, "timeout", ""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        attempts += 1
        family, stype, proto, _, addr = infos[(attempts - 1) % len(infos)]
        s = socket.socket(family, stype, proto)
        s.settimeout(max(0.05, min(attempt_timeout, remaining)))
        try:
            s.connect(addr)
        except socket.timeout:
            kind, detail = "timeout", f"no answer from {addr[0]}:{addr[1]}"
        except OSError as e:
            if e.errno == errno.ECONNREFUSED:
                kind, detail = "refused", f"{addr[0]}:{addr[1]} refused the connection"
            elif e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
                kind, detail = "unreachable", f"{addr[0]}: {e.strerror}"
            else:
                kind, detail = "timeout", f"{addr[0]}:{addr[1]}: {e}"
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        else:
            s.close()
            if not check_store:
                return Reach(True, "", "", attempts, time.monotonic() - start)
            problem = identify_store(host, port, deadline - time.monotonic())
            if problem is None:
                return Reach(True, "", "", attempts, time.monotonic() - start)
            detail, answer = problem
            return Reach(False, "not_store", detail, attempts, time.monotonic() - start, answer)
        finally:
            s.close()
    return Reach(False, kind, detail, attempts, time.monotonic() - start)


PEER_PROBE_S = 2.5   # what identify_store keeps for asking the peer what it is, out of its bound
BANNER_WAIT_S = 1.0  # how long the peer may take to speak first (SSH, SMTP, FTP do), or to answer
HTTP_PROBE = b"HEAD / HTTP/1.0\r\n\r\n"


def _store_client(host: str, port: int, timeout: float) -> Any:
    import torch.distributed as dist
    return dist.TCPStore(host, port, world_size=None, is_master=False,
                         timeout=timedelta(seconds=timeout), wait_for_workers=False)


def identify_store(host: str, port: int, bound: float) -> tuple[str, str] | None:
    """None when a torch store answers torch's own client handshake at host:port; else (what
    happened, what the peer sent: "" when silent), found within about `bound` seconds.

    torch's client, not a copy of its wire protocol, decides (so a store of any torch version
    counts); its handshake has no timeout of its own, so it runs bounded and is abandoned when the
    peer never answers (an HTTP server waits for a line end that torch never sends)."""
    start = time.monotonic()
    wait = max(2.0, bound - PEER_PROBE_S)
    out = call_with_time_limit(lambda: _store_client(host, port, wait), wait, name="ddp-doctor-store-probe")
    if out.finished and out.error is None:
        return None
    if out.finished:
        first = str(out.error).strip().splitlines()[0] if str(out.error).strip() else type(out.error).__name__
        what = f"torch's store handshake failed ({first[:200]})"
    else:
        what = f"torch's store handshake got no answer in {time.monotonic() - start:.1f} s"
    said, how = peer_answer(host, port)
    return f"{what}; {how}", said


def peer_answer(host: str, port: int, wait: float = BANNER_WAIT_S) -> tuple[str, str]:
    """(what the peer at host:port sent, in words how it behaved): first it may speak unasked (a
    banner); if it stays silent it gets an HTTP probe line. Bounded: about 2 x `wait` + connect."""
    try:
        s = socket.create_connection((host, port), timeout=2.0)
    except OSError as e:
        return "", f"then the port stopped accepting connections ({e})"
    try:
        s.settimeout(wait)
        for sent in (b"", HTTP_PROBE):
            try:
                if sent:
                    s.sendall(sent)
                data = s.recv(512)
            except socket.timeout:
                continue
            except OSError as e:
                return "", f"the peer reset the connection ({e.strerror or e})"
            said = printable(data)
            if not data:
                return "", ("the peer closed the connection without a word" if not sent else
                            "the peer closed the connection on an HTTP probe line, sending nothing")
            if not sent:
                return said, f"the peer speaks first, as a server of another protocol does: {said!r}"
            return said, f"it answers an HTTP probe line: {said!r}"
        return "", ("the peer is silent: it accepted the connection, then sent nothing, to torch's "
                    "handshake nor to an HTTP probe line")
    finally:
        s.close()


def printable(data: bytes, limit: int = 120) -> str:
    """The first line of what a peer sent, for a message (plus the HTTP Server: header if any)."""
    text = data.decode("latin-1")
    lines = text.splitlines()
    first = lines[0] if lines else ""
    server = next((ln for ln in lines[1:] if ln.lower().startswith("server:")), "")
    out = first + (f" ({server.strip()})" if server else "")
    out = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in out)
    return out[:limit] + ("..." if len(out) > limit else "")


def port_in_use(port: int) -> str | None:
    """None when this host can listen on `port`, else the error text."""
    for family, addr in ((socket.AF_INET, "0.0.0.0"),):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
        except OSError as e:
            return str(e)
        finally:
            s.close()
    return None


def local_addresses() -> set[str]:
    out = {"127.0.0.1", "::1", "0.0.0.0"}
    try:
        import psutil
        for addrs in psutil.net_if_addrs().values():
            out.update(a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
    except Exception:  # noqa: BLE001 - psutil missing or the kernel refused: the loopback names alone
        pass
    return out


def is_local_host(host: str) -> bool | None:
    """Does `host` resolve to an address of this machine? None when it cannot be told."""
    infos, _ = _resolve(host, 0, 5.0)
    if not infos:
        return None
    mine = local_addresses()
    return any(i[4][0] in mine or i[4][0].startswith("127.") for i in infos)


# ---------------------------------------------------------------- the store exchange

ALL_HERE = "arrived/all"  # set by rank 0 once every rank's view is in the store
PARTS = "$parts"  # in a view's line of short values: the keys whose values are the lines after it, in order
PART_MIN = 256  # characters: a view's list or dict this long (as JSON) has a line of its own


# compact, and no check for cycles (a view is plain data): a rank's view is encoded before it checks in
_ENCODE = json.JSONEncoder(check_circular=False, separators=(",", ":")).encode


def view_text(view: dict[str, Any]) -> str:
    """The view as a rank puts it in the store (after its claim's token: view_record): its short
    values as one line of JSON, where each long list or dict (the communication settings, the
    findings: alike on most ranks) is left out (None in its place) and named in PARTS, then each
    of those long values on a line of its own (compact JSON holds no line break). The reporting
    rank parses each distinct long line once over every view it reads (ViewReader)."""
    small: dict[str, Any] = {}
    names: list[str] = []
    longs: list[str] = []
    for k, v in view.items():
        if v and isinstance(v, (dict, list)):
            text = _ENCODE(v)
            if len(text) >= PART_MIN:
                names.append(k)
                longs.append(text)
                v = None
        small[k] = v
    if names:
        small[PARTS] = names
    return "\n".join([_ENCODE(small), *longs])


def view_record(token: str, text: str) -> str:
    """What a rank's check-in puts at view/<rank>: its claim's token (claim_token) on the first
    line, then its view_text."""
    return f"{token}\n{text}"


def parse_record(raw: bytes | str, parts: dict[str, Any]) -> dict[str, Any]:
    """The view a rank made, from its record (view_record). `parts`: long values already parsed,
    by their line (those parsed here are added). ValueError when it is no view record."""
    lines = (raw.decode("utf-8") if isinstance(raw, bytes) else raw).split("\n")
    view = json.loads(lines[1]) if len(lines) > 1 else None
    if not isinstance(view, dict):
        raise ValueError("not a view record: no line of JSON short values after a token")
    names = view.pop(PARTS, None) or []
    if not isinstance(names, list) or len(names) != len(lines) - 2:
        raise ValueError(f"not a view record: {len(lines) - 2} long value line(s) for the keys {names!r}")
    for k, line in zip(names, lines[2:]):
        v = parts.get(line)
        if v is None:
            v = parts[line] = json.loads(line)
        view[k] = v
    return view


class ViewReader:
    """Reads views as their ranks made them, each distinct long value parsed once over all its
    reads (see view_text). Ranks with alike values share one parsed copy of it: read them, never
    change them. A rank whose record is no view this reader reads (another ddp-doctor version's)
    is left out of what `read` returns and named in `unreadable` with why (for
    checks/rendezvous.py unreadable_finding)."""

    def __init__(self, own: str | None = None) -> None:
        # the reader's own long values (its view_text): on most ranks alike, so in the usual job
        # no long value is parsed at all
        self.parts: dict[str, Any] = {line: json.loads(line) for line in own.split("\n")[1:]} if own else {}
        self.unreadable: dict[int, str] = {}

    def read(self, store: Any, ranks: list[int], deadline: float, *,
             present: bool = False) -> dict[int, dict[str, Any]]:
        """The views of `ranks` that are in the store by the deadline, in one request (`present`:
        every one of `ranks` is known to have checked in: no wait for them first), but those that
        are no view record (self.unreadable)."""
        views: dict[int, dict[str, Any]] = {}
        for k, v in read_keys(store, [f"view/{r}" for r in ranks], deadline, present=present).items():
            r = int(k.rsplit("/", 1)[1])
            try:
                views[r] = parse_record(v, self.parts)
            except ValueError as e:  # UnicodeDecodeError and JSON's errors are ValueErrors too
                self.unreadable[r] = str(e)[:200]
        return views


def read_views(store: Any, ranks: list[int], deadline: float, *, present: bool = False,
               own: str | None = None) -> dict[int, dict[str, Any]]:
    """The views of `ranks` that are in the store by the deadline (ViewReader.read; `own`: the
    reader's own view_text, whose long values it need not parse)."""
    return ViewReader(own).read(store, ranks, deadline, present=present)


@dataclass
class Meeting:
    """What a rank learned at the store: the ranks that came are 0..world_size-1 but the missing
    (a list made only when asked for: a rank whose world all came does nothing of the world's size)."""
    store: Any
    world_size: int
    missing: list[int]
    findings: list[Finding] = field(default_factory=list)
    views: dict[int, dict[str, Any]] = field(default_factory=dict)  # those rank 0 read as they came

    @property
    def arrived(self) -> list[int]:
        gone = set(self.missing)
        return [r for r in range(self.world_size) if r not in gone] if gone else list(range(self.world_size))

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def reporter(self) -> int:
        """Rank 0 reports when it is there; otherwise the lowest rank that arrived."""
        gone = set(self.missing)
        return next((r for r in range(self.world_size) if r not in gone), -1)


def meet(store: Any, rank: int, world_size: int, view: dict[str, Any], timeout: float,
         text: str | None = None, master: tuple[str, int] | None = None) -> Meeting:
    """Check in, publish this rank's view, and wait (bounded) until every rank has done so.
    `text`: view_text(view), made as the view was (the rank's own work, before it reaches the
    store); made here when not given. `master`: the store's MASTER_ADDR and MASTER_PORT, for a
    finding to name.

    Two requests a rank when all goes well, whatever the world size, as a plain store barrier
    (add, wait) sends: the check-in, one compare_set that claims the rank and puts its view
    (view_record: a token no other claim has, then the view with its long values) at view/<rank>
    only if no process put one there first (the answer is what is there: this claim's record or
    the first claimant's), and one wait on the store's side (no polling). A rank other than 0
    sends both under one bound (the meeting's timeout and an operation's bound): at scale a
    rank's own CPU at its check-in is what the others wait on, and a note for the store's
    watchdog is some of it. Rank 0 waits for the views a chunk of ranks at a time (one wait
    each) and reads each chunk as it is complete (Meeting.views), then says "all here" in one
    key, which the others wait for. Only when some rank is missing does each find who came
    (present_ranks: a few requests per missing rank).

    A process that claims a rank already claimed is not a member: it leaves the first claimant's
    view alone and is counted among the extras (add_extra), which fails everyone there (crowd).
    A RANK outside 0..WORLD_SIZE-1 is not waited for either (its own check says why)."""
    findings: list[Finding] = []
    bound = op_bound(timeout)
    deadline = time.monotonic() + timeout
    token = claim_token()
    if text is None:
        text = view_text(view)
    record, tag = view_record(token, text), f"{token}\n"
    tag_bytes = tag.encode()  # torch's answer is bytes: compared as they are, none of it decoded

    def check_in() -> tuple[bool, Any, bool | None]:
        """(this claim holds the rank, the record there, whether every rank came: None when not
        waited for): the check-in and, for a member other than rank 0, its wait."""
        got = store.compare_set(f"view/{rank}", "", record)
        if not (got.startswith(tag_bytes) if isinstance(got, bytes) else str(got).startswith(tag)):
            return False, got, None
        if rank == 0:
            return True, got, None
        try:
            store.wait([ALL_HERE], timedelta(seconds=max(0.001, deadline - time.monotonic())))
            return True, got, True
        except Exception:  # noqa: BLE001 - torch says "wait timeout" in several ways; a lost store
            return True, got, False  # fails the check below

    member, got, came = store_call(check_in, "the check-in (compare_set(view))" if rank == 0 else
                                   "the check-in (compare_set(view)) and the wait for every rank's",
                                   bound if rank == 0 else bound + timeout)  # rank 0 waits apart, a chunk at a time
    if not member:  # counted among the later claimants (the first one never counts itself)
        claims = 1 + int(store_call(lambda: store.add(f"claim/{rank}", 1), "add(claim)", bound))
        first = _first_claimant(got)
        findings.append(ev.duplicate_rank_finding(rank, claims, view.get("hostname"), view.get("pid"), first))
        add_extra(store, {"rank": rank, "pid": view.get("pid"), "host": view.get("hostname"),
                          "why": "claimed a rank already claimed"}, bound)
    views: dict[int, dict[str, Any]] = {}
    if member and rank == 0:  # the first claimant of rank 0 sees every view arrive, and says so
        complete = _read_as_they_come(store, world_size, deadline, ViewReader(text), views)
        if complete:
            store_call(lambda: store.set(ALL_HERE, "1"), f"set({ALL_HERE!r})", bound)
    elif came is not None:
        complete = came or bool(store_call(lambda: store.check([ALL_HERE]), f"check({ALL_HERE!r})", bound))
    else:
        complete = wait_keys(store, [ALL_HERE], "every rank's check-in", deadline)
    if complete:  # nothing a rank but rank 0 computes here grows with the world size
        return Meeting(store, world_size, [], findings, views)
    arrived = present_ranks(store, world_size, bound)
    present = set(arrived)
    missing = [r for r in range(world_size) if r not in present]
    if missing:  # more check-ins than ranks without a gap is a duplicate claim (DDP322)
        host, port = master if master is not None else (None, None)
        findings.append(ev.ranks_missing_finding(ev.Missing(
            world_size=world_size, arrived=tuple(arrived), bound_s=timeout, master_addr=host, master_port=port), rank))
    return Meeting(store=store, world_size=world_size, missing=missing, findings=findings, views=views)


def _first_claimant(record: Any) -> dict[str, Any] | None:
    """{"pid", "host"} of the process whose record holds a rank (what a later claim gets back);
    None when it is no view record."""
    try:
        v = parse_record(record, {})
    except ValueError:
        return None
    return {"pid": v.get("pid"), "host": v.get("hostname")}


_CLAIMS = itertools.count()
_PROCESS = os.urandom(8).hex()


def _new_process() -> None:
    global _CLAIMS, _PROCESS
    _CLAIMS, _PROCESS = itertools.count(), os.urandom(8).hex()


if hasattr(os, "register_at_fork"):  # a forked child names its claims apart from its parent's
    os.register_at_fork(after_in_child=_new_process)


def claim_token() -> str:
    """A token no other claim of a rank has: this process's random name and a count (no system
    call a claim: a rank's own CPU at its check-in is what the store's clients wait on at scale)."""
    return f"{_PROCESS}.{next(_CLAIMS)}"


READ_CHUNK = 128  # ranks whose views rank 0 waits for and reads at a time, while the later ones come


def _read_as_they_come(store: Any, world_size: int, deadline: float, reader: ViewReader,
                       views: dict[int, dict[str, Any]]) -> bool:
    """Rank 0's wait for every view: READ_CHUNK ranks at a time (one wait each, on the store's
    side), reading each chunk's views once it is all there, while the later ranks still come; so
    that once the last rank is in, all but its chunk are read, and the release of the others
    (ALL_HERE) is not followed by reading them all. True when every view came by the deadline
    (`views` then holds them all; else those of the chunks that came whole)."""
    for lo in range(0, world_size, READ_CHUNK):
        ranks = list(range(lo, min(lo + READ_CHUNK, world_size)))
        if not wait_keys(store, [f"view/{r}" for r in ranks], "every rank's check-in", deadline):
            return False
        views.update(reader.read(store, ranks, deadline, present=True))  # but those no view (reader.unreadable)
    return True


def present_ranks(store: Any, world_size: int, bound: float) -> list[int]:
    """The ranks whose view is in the store, found by halving: one request says a whole range is
    there (check of its keys), so k missing ranks cost about 2k log2(world_size) requests, not
    one per rank (at 4,096 ranks, every rank reading every key would be 16 million requests)."""
    out: list[int] = []
    pending = [(0, world_size)]
    while pending:
        lo, hi = pending.pop()
        keys = [f"view/{r}" for r in range(lo, hi)]
        if store_call(lambda keys=keys: store.check(keys), f"check(views {lo}-{hi - 1})", bound):
            out.extend(range(lo, hi))
        elif hi - lo > 1:
            mid = (lo + hi) // 2
            pending += [(mid, hi), (lo, mid)]
    return sorted(out)


# ---------------------------------------------------------------- two jobs at one store

ANNOUNCE_S = 3.0  # a rank 0 that could not host: how long it tries the store that holds its port


def add_extra(store: Any, who: dict[str, Any], bound: float) -> None:
    """Count a process that met at this store without being one of its world's ranks: a second
    claimant of a rank, or a rank 0 that could not host the store here (announce)."""
    k = int(store_call(lambda: store.add("extra", 1), "add(extra)", bound))
    text = json.dumps(who)
    store_call(lambda: store.set(f"extra/{k}", text), "set(extra)", bound)


def crowd(store: Any, world_size: int, bound: float) -> Crowd | None:
    """None while this store holds no more processes than `world_size` ranks (two requests); else
    who is there. Read by the reporting rank just before its verdict, by the others once they have
    read it. A member is the first claimant of a rank (its view is there): those of 0..world_size-1,
    and those of a larger world met here (another job's ranks past this world's, counted up to
    twice this world)."""
    extra = int(store_call(lambda: store.add("extra", 0), "add(extra)", bound))
    beyond = bool(store_call(lambda: store.check([f"view/{world_size}"]), "check(a view past the world)", bound))
    if extra == 0 and not beyond:
        return None
    members = len(present_ranks(store, 2 * world_size if beyond else world_size, bound))
    soon = time.monotonic() + 1.0  # a key counted a moment ago is being written
    extras = [v for v in read_json_keys(store, [f"extra/{k}" for k in range(1, min(extra, MAX_NAMED) + 1)],
                                        soon).values() if isinstance(v, dict)]
    claimed = sorted({e["rank"] for e in extras if isinstance(e.get("rank"), int)})
    firsts = ViewReader().read(store, claimed, soon)
    named = [{"rank": v.get("rank"), "pid": v.get("pid"), "host": v.get("hostname"), "why": "claimed it first"}
             for v in firsts.values() if isinstance(v, dict)]
    return Crowd(world_size, members, extra, named + extras)


def announce(host: str, port: int, prefix: str, who: dict[str, Any], world_size: int,
             bound: float = ANNOUNCE_S) -> Crowd | None:
    """A rank 0 that could not host the store because MASTER_PORT is taken: when a torch store
    answers there, this process is counted among its extras, so that a job whose rendezvous runs
    there fails too (two jobs at one port never pass); returns the crowd there once that job's
    rank 0 is seen in it (its view appears within moments of its store), else None (a store of
    something else, or no torch store: the taken port alone is the finding). Bounded by about
    2 x `bound`; never raises."""
    try:
        base = connect_store(host, port, hosting=False, timeout=bound)
        store = prefixed(base, prefix)
        b = op_bound(bound)
        add_extra(store, who, b)
        if not wait_keys(store, ["view/0"], "rank 0's check-in", time.monotonic() + bound):
            return None
        return crowd(store, world_size, b)
    except Exception:  # noqa: BLE001 - not a store, gone, or not answering: the port in use says it
        return None


def agree_job_token(store: Any, bound: float) -> str | None:
    """A token naming the job in its records (training/records.py, join_job), proposed at this
    store by the reporting rank and sent to the others with its verdict (the first proposal wins,
    should two ranks report); None if the store cannot say."""
    import uuid
    try:
        got = store_call(lambda: store.compare_set("job_token", "", uuid.uuid4().hex), "compare_set(job_token)", bound)
        return (got.decode("utf-8") if isinstance(got, bytes) else str(got)) or None
    except Exception:  # noqa: BLE001 - an old store: the records are then judged by time alone
        return None
