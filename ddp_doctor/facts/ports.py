"""Who holds a TCP port on this host, and whether an error text says a bind failed because the
port is taken. Pure readers: psutil's view of the sockets, nothing is changed.

Used where a store could not listen on MASTER_PORT (DDP313), so the finding names the process in
the way instead of leaving the user to run `ss -ltnp`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

CMDLINE_LIMIT = 200  # characters of a holder's command line kept in a finding

# torch's TCPStore: "The server socket has failed to listen on any local network address.
# port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use";
# Python's OSError: "[Errno 98] Address already in use"; macOS/BSD: errno 48.
_IN_USE = re.compile(r"EADDRINUSE|address already in use|errno 98\b|code: -98\b", re.IGNORECASE)
_PORT = re.compile(r"\bport:?\s*(\d{1,5})\b", re.IGNORECASE)


def address_in_use(text: str) -> bool:
    """Does this error text say a socket could not bind/listen because the address is taken?"""
    return bool(_IN_USE.search(text or ""))


def failed_port(text: str) -> int | None:
    """The port an error text names ("port: 29500"), when it names one."""
    m = _PORT.search(text or "")
    if not m:
        return None
    port = int(m.group(1))
    return port if 0 < port < 65536 else None


@dataclass(frozen=True)
class PortHolder:
    """A process holding a port: pid None when this host does not let us see whose socket it is;
    cmdline None when the process is seen but its command line is not readable."""
    pid: int | None
    cmdline: str | None = None
    address: str | None = None  # "127.0.0.1:29500", the local address it holds

    def describe(self) -> str:
        if self.pid is None:
            return "an unknown process (this user may not see whose socket it is)"
        return f"pid {self.pid} ({self.cmdline})" if self.cmdline else f"pid {self.pid} (command line not readable)"

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "cmdline": self.cmdline, "address": self.address}


def _laddr(conn: Any) -> tuple[str, int] | None:
    addr = getattr(conn, "laddr", None)
    if not addr:
        return None
    try:
        return str(addr[0]), int(addr[1])
    except (IndexError, TypeError, ValueError):
        return None


def holders_from(connections: Iterable[Any], port: int,
                 cmdline_of: Callable[[int], str | None]) -> list[PortHolder]:
    """The holders of `port` among psutil-like connections (laddr, status, pid): the listening
    sockets on the port, else any other socket bound to it locally. One entry per pid; sockets
    whose pid is not visible become one "unknown" holder (pid None)."""
    conns = [(c, a) for c in connections if (a := _laddr(c)) is not None and a[1] == port]
    listening = [(c, a) for c, a in conns if str(getattr(c, "status", "")).upper() == "LISTEN"]
    out: list[PortHolder] = []
    seen: set[int | None] = set()
    for c, (host, p) in listening or conns:
        pid = getattr(c, "pid", None)
        if pid in seen:
            continue
        seen.add(pid)
        where = f"[{host}]:{p}" if ":" in host else f"{host}:{p}"
        out.append(PortHolder(pid, cmdline_of(pid) if pid is not None else None, where))
    return sorted(out, key=lambda h: (h.pid is None, h.pid or 0))


def _cmdline(pid: int) -> str | None:
    """A process's command line (its name when the arguments are not readable), shortened."""
    try:
        import psutil
        p = psutil.Process(pid)
        try:
            text = " ".join(p.cmdline()) or p.name()
        except (psutil.AccessDenied, psutil.ZombieProcess):
            text = p.name()
    except Exception:  # noqa: BLE001 - gone, not permitted, psutil missing: not readable
        return None
    text = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    return (text[:CMDLINE_LIMIT] + "...") if len(text) > CMDLINE_LIMIT else (text or None)


def _all_connections() -> list[Any]:
    """Every TCP socket on this host with its pid where visible. psutil.net_connections needs
    root on some systems (macOS): then each process's own sockets, as far as permitted."""
    import psutil
    try:
        return list(psutil.net_connections(kind="tcp"))
    except psutil.AccessDenied:
        pass
    out: list[Any] = []
    for proc in psutil.process_iter():
        try:
            own = proc.net_connections(kind="tcp") if hasattr(proc, "net_connections") \
                else proc.connections(kind="tcp")
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        out += [_WithPid(c, proc.pid) for c in own]
    return out


@dataclass(frozen=True)
class _WithPid:
    """A per-process connection (which carries no pid) with its process's pid."""
    conn: Any
    pid: int

    @property
    def laddr(self) -> Any:
        return self.conn.laddr

    @property
    def status(self) -> Any:
        return self.conn.status


def port_holders(port: int) -> list[PortHolder]:
    """Who holds TCP `port` on this host: [] when nobody is seen holding it, or when the sockets
    cannot be listed at all (psutil missing, not permitted)."""
    try:
        conns = _all_connections()
    except Exception:  # noqa: BLE001 - psutil missing or the kernel refused: nothing to tell
        return []
    return holders_from(conns, port, _cmdline)
