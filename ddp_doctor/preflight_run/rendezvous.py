"""Bounded rendezvous: reach the master, meet the other ranks in the store, say who is missing.

Before any collective, a rank tries MASTER_ADDR:MASTER_PORT with short connection attempts and
classifies a failure (does not resolve / refused / timed out). Ranks then check in at the store
under a prefix of ddp-doctor's own; the store, unlike a collective, tells which ranks did arrive.
Every wait here ends at a deadline.
"""
from __future__ import annotations

import errno
import json
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ddp_doctor.checks import rendezvous as ev
from ddp_doctor.checks.internal import event_finding
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.time_limit import call_with_time_limit

POLL_S = 0.05
DEFAULT_PORT = 29500


@dataclass
class Reach:
    ok: bool
    kind: str = ""        # "" | unresolvable | refused | timeout | unreachable
    detail: str = ""
    attempts: int = 0
    elapsed_s: float = 0.0


def _resolve(host: str, port: int, bound: float) -> tuple[list[Any] | None, str]:
    """getaddrinfo has no timeout of its own: run it in a thread and give up at the bound."""
    out = call_with_time_limit(lambda: socket.getaddrinfo(host, port, type=socket.SOCK_STREAM), bound,
                               name="ddp-doctor-resolve")
    if not out.finished:
        return None, f"no answer from the resolver within {bound:g} s"
    if out.error is not None:
        return None, str(out.error)
    return out.value, ""


def reach_master(host: str, port: int, bound: float, attempt_timeout: float = 2.0) -> Reach:
    """Try to open a TCP connection to host:port until it works or `bound` seconds pass.

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
            return Reach(True, "", "", attempts, time.monotonic() - start)
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
        finally:
            s.close()
    return Reach(False, kind, detail, attempts, time.monotonic() - start)


def reach_finding(reach: Reach, host: str, port: int, rank: int | None, bound: float) -> Finding:
    where = f"MASTER_ADDR={host} MASTER_PORT={port}"
    evidence = {"master_addr": host, "master_port": port, "attempts": reach.attempts,
                "elapsed_s": round(reach.elapsed_s, 3), "bound_s": bound, "detail": reach.detail}
    if reach.kind == "unresolvable":
        return event_finding(ev.MASTER_UNRESOLVABLE, f"{where}: the name does not resolve on this rank "
                           f"({reach.detail})", rank=rank, evidence=evidence)
    if reach.kind == "refused":
        return event_finding(ev.MASTER_REFUSED, f"{where}: connection refused for {bound:g} s "
                           f"({reach.attempts} attempts): nothing listens there", rank=rank,
                           evidence=evidence)
    return event_finding(ev.MASTER_TIMEOUT, f"{where}: no connection within {bound:g} s "
                       f"({reach.attempts} attempts; {reach.detail})", rank=rank, evidence=evidence)


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
    except Exception:
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

@dataclass
class Meeting:
    """What a rank learned at the store."""
    store: Any
    arrived: list[int]
    missing: list[int]
    findings: list[Finding] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def reporter(self) -> int:
        """Rank 0 reports when it is there; otherwise the lowest rank that arrived."""
        return min(self.arrived) if self.arrived else -1


def connect_store(host: str, port: int, *, hosting: bool, timeout: float) -> Any:
    import torch.distributed as dist
    return dist.TCPStore(host, port, world_size=None, is_master=hosting,
                         timeout=timedelta(seconds=timeout), wait_for_workers=False)


def prefixed(store: Any, prefix: str) -> Any:
    import torch.distributed as dist
    return dist.PrefixStore(prefix, store)


def _wait_count(store: Any, key: str, target: int, deadline: float) -> int:
    n = 0
    while True:
        n = int(store.add(key, 0))
        if n >= target or time.monotonic() >= deadline:
            return n
        time.sleep(POLL_S)


def meet(store: Any, rank: int, world_size: int, view: dict[str, Any], timeout: float) -> Meeting:
    """Check in, publish this rank's view, and wait (bounded) until every rank has done so."""
    findings: list[Finding] = []
    claims = int(store.add(f"claim/{rank}", 1))
    if claims > 1:
        findings.append(event_finding(
            ev.DUPLICATE_RANK, f"RANK={rank} was claimed by {claims} processes (this one on host "
            f"{view.get('hostname')}, pid {view.get('pid')})", rank=rank,
            evidence={"rank": rank, "claims": claims}))
    store.set(f"view/{rank}", json.dumps(view))
    store.add("arrived", 1)
    n = _wait_count(store, "arrived", world_size, time.monotonic() + timeout)
    arrived = [r for r in range(world_size) if store.check([f"view/{r}"])]
    missing = [r for r in range(world_size) if r not in arrived]
    if missing:  # more check-ins than ranks without a gap is a duplicate claim (DDP322)
        findings.append(event_finding(
            ev.RANKS_MISSING,
            f"WORLD_SIZE={world_size} but only {len(arrived)} rank(s) checked in within {timeout:g} s: "
            f"arrived {format_ranks(arrived) or 'none'}; missing {format_ranks(missing) or 'none'}",
            rank=rank, ranks=missing or [rank],
            evidence={"world_size": world_size, "arrived": arrived, "missing": missing,
                      "check_ins": n, "timeout_s": timeout}))
    return Meeting(store=store, arrived=arrived, missing=missing, findings=findings)


def read_json_keys(store: Any, keys: list[str], deadline: float) -> dict[str, Any]:
    """Read the keys that appear before the deadline; the absent ones are left out."""
    out: dict[str, Any] = {}
    pending = list(keys)
    while pending:
        for k in list(pending):
            if store.check([k]):
                out[k] = json.loads(store.get(k).decode("utf-8"))
                pending.remove(k)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    return out
