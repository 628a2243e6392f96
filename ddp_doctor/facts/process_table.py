"""The processes a rank's script started that are still alive when the script has ended: found by
the process tree, by the rank's session or process group, and by a mark in their environment
(never by name). Pure readers of the process table (psutil, or /proc where psutil is missing);
ending them is training/run/child_watch.py's job.

Why three ways: a plain child is in the tree; a child in its own session (`start_new_session=True`)
is in the tree while its parent lives; a double-forked daemon is reparented to the rank, which is a
child subreaper while its script runs (training/run/child_watch.py), so it is the rank's child; where
that is not available it is reparented away from the tree (to init) and, after setsid, is in no
session of ours, but it still carries the
environment the rank gave it: `MARK_ENV` (a value unique to the rank) is put in the rank's
environment before its script runs, and every process started from it inherits the mark unless
it replaces its whole environment. The session (when the rank leads one, as torchrun's ranks do)
and the process group (when it leads one) catch a daemon that cleared its environment but did not
call setsid. Members of the session or group that existed before the script started (the rank's
pipeline partners, say) are never counted, nor anything started from them.
"""
from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass
from typing import Any, Iterable

MARK_ENV = "DDP_DOCTOR_PROCESS_MARK"
CHILD, DESCENDANT, MARKED, SESSION, GROUP = "child", "descendant", "environment mark", "session", "process group"


@dataclass(frozen=True)
class Proc:
    """One process: `started` orders processes and tells a reused pid (psutil's create time, or
    /proc's start time in clock ticks: comparable within one source); `marked`: its environment
    holds MARK_ENV with the value asked for."""
    pid: int
    ppid: int
    sid: int
    pgid: int
    started: float
    zombie: bool = False
    marked: bool = False


def _psutil() -> Any:
    try:
        import psutil
        return psutil
    except ImportError:
        return None


def _from_proc(pid: int, mark: bytes | None) -> Proc | None:
    """A process from /proc/PID/stat (and environ for the mark); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()  # the name in parentheses may hold spaces
    try:
        state, ppid, pgid, sid, started = fields[0], int(fields[1]), int(fields[2]), int(fields[3]), float(fields[19])
    except (IndexError, ValueError):
        return None
    marked = False
    if mark is not None:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                marked = mark in b"\0" + f.read()
        except OSError:  # another user's process: not ours to read, nor to end
            pass
    return Proc(pid, ppid, sid, pgid, started, zombie=state in (b"Z", b"X"), marked=marked)


def _from_psutil(psutil: Any, p: Any, mark: str | None) -> Proc | None:
    try:
        with p.oneshot():
            ppid, started, zombie = p.ppid(), p.create_time(), p.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
        sid, pgid = os.getsid(p.pid), os.getpgid(p.pid)
    except (psutil.Error, OSError):
        return None
    marked = False
    if mark is not None:
        try:
            marked = p.environ().get(MARK_ENV) == mark
        except (psutil.Error, OSError):
            pass
    return Proc(p.pid, ppid, sid, pgid, started, zombie=zombie, marked=marked)


def _mark_bytes(mark: str | None) -> bytes | None:
    return None if mark is None else f"\0{MARK_ENV}={mark}\0".encode()


def process_table(mark: str | None = None) -> dict[int, Proc]:
    """Every process this user can see, with whether it carries `mark` (None: not looked at)."""
    psutil = _psutil()
    if psutil is not None:
        out = {}
        for p in psutil.process_iter():
            got = _from_psutil(psutil, p, mark)
            if got is not None:
                out[got.pid] = got
        return out
    want = _mark_bytes(mark)
    procs = (_from_proc(int(n), want) for n in os.listdir("/proc") if n.isdigit())
    return {p.pid: p for p in procs if p is not None}


def process(pid: int) -> Proc | None:
    """One process as process_table has it (no mark), None when it is gone."""
    psutil = _psutil()
    if psutil is None:
        return _from_proc(pid, None)
    try:
        return _from_psutil(psutil, psutil.Process(pid), None)
    except psutil.Error:
        return None


def _children(table: dict[int, Proc]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for p in table.values():
        if p.ppid != p.pid:
            kids.setdefault(p.ppid, []).append(p.pid)
    return kids


def subtree(table: dict[int, Proc], roots: Iterable[int]) -> set[int]:
    """The processes in `roots` and every descendant of theirs that is still attached."""
    kids = _children(table)
    seen: set[int] = set()
    todo = [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(kids.get(pid, ()))
    return seen


def ancestors(table: dict[int, Proc], pid: int) -> set[int]:
    out: set[int] = set()
    p = table.get(pid)
    while p is not None and p.ppid not in out and p.ppid != p.pid and p.ppid > 0:
        out.add(p.ppid)
        p = table.get(p.ppid)
    return out


def _leads(table: dict[int, Proc], root: int, by_session: bool, by_group: bool) -> tuple[bool, bool]:
    me = table.get(root)
    return (by_session and me is not None and me.sid == root), (by_group and me is not None and me.pgid == root)


def before_script(table: dict[int, Proc], root: int, *, by_session: bool = True,
                  by_group: bool = True) -> frozenset[tuple[int, float]]:
    """What is never a leftover of the script: (pid, started) of the rank's descendants and of the
    members of the session or group it leads, as they are before the script runs."""
    session, group = _leads(table, root, by_session, by_group)
    keep = {p.pid for p in table.values() if (session and p.sid == root) or (group and p.pgid == root)}
    keep |= subtree(table, [root])
    return frozenset((pid, table[pid].started) for pid in keep if pid in table)


def leftovers(table: dict[int, Proc], root: int, *, before: frozenset[tuple[int, float]] = frozenset(),
              owned: Iterable[int] = (), by_session: bool = True, by_group: bool = True) -> dict[int, str]:
    """The live processes `root`'s script left (pid -> how found: CHILD, DESCENDANT, MARKED, SESSION,
    GROUP). Never `root`, its ancestors, what existed `before` the script, nor `owned` processes
    (the interpreter's or torch's own helpers), nor anything started from those."""
    session, group = _leads(table, root, by_session, by_group)
    found: dict[int, str] = {}
    for pid in sorted(subtree(table, [root]) - {root}):
        found[pid] = CHILD if table[pid].ppid == root else DESCENDANT
    for p in sorted(table.values(), key=lambda p: p.pid):
        how = MARKED if p.marked else SESSION if session and p.sid == root else \
            GROUP if group and p.pgid == root else None
        if how is not None:
            found.setdefault(p.pid, how)
    mine = {root} | ancestors(table, root)
    earlier = [pid for pid, started in before if pid in table and table[pid].started == started and pid not in mine]
    never = mine | subtree(table, [*earlier, *(p for p in owned if p not in mine)])
    return {pid: how for pid, how in found.items() if pid not in never and not table[pid].zombie}


# ---------------------------------------------------------------- what one process looks like
CMDLINE_LIMIT = 300  # characters of a leftover's command line kept


def command_line(pid: int) -> str | None:
    """A process's command line, shortened; None when it cannot be read."""
    from ddp_doctor.facts.ports import _cmdline  # psutil's view, as a port's holder is named
    text = _cmdline(pid)
    if text is None:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                text = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip() or None
        except OSError:
            return None
    if text is None:
        return None
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    return text if len(text) <= CMDLINE_LIMIT else text[:CMDLINE_LIMIT - 3] + "..."


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listening_ports(pid: int) -> list[str]:
    """The TCP addresses a process listens on ("127.0.0.1:8080", "[::]:22"); [] when none or not
    readable."""
    psutil = _psutil()
    if psutil is not None:
        try:
            p = psutil.Process(pid)
            conns = p.net_connections(kind="tcp") if hasattr(p, "net_connections") else p.connections(kind="tcp")
        except (psutil.Error, OSError):
            return []
        return sorted({_address(str(c.laddr[0]), int(c.laddr[1])) for c in conns
                       if c.laddr and str(c.status).upper() == "LISTEN"})
    return _listening_from_proc(pid)


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out


def _hex_address(text: str) -> tuple[str, int]:
    """/proc/net/tcp's "0100007F:1F90" (each 32-bit word in host byte order) -> ("127.0.0.1", 8080)."""
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(struct.pack("=I", struct.unpack(">I", raw[i:i + 4])[0]) for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words), int(port, 16)


def _listening_from_proc(pid: int) -> list[str]:
    """The listening sockets of /proc/PID/net/tcp{,6} (the process's own network namespace) whose
    inode is one of the process's open sockets."""
    inodes = _socket_inodes(pid)
    out = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}", encoding="ascii", errors="replace") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and cols[9] in inodes:  # 0A: TCP_LISTEN
                try:
                    out.add(_address(*_hex_address(cols[1])))
                except (ValueError, OSError, struct.error):
                    continue
    return sorted(out)


# ---------------------------------------------------------------- the interpreter's and torch's own
def own_helpers(*, interpreter_exits: bool = True) -> set[int]:
    """Processes this interpreter or torch started for themselves, which end them on their own:
    torch's compile workers (they watch their parent), multiprocessing's resource tracker and
    forkserver; and, when the interpreter exits normally (`interpreter_exits`), the
    multiprocessing children, which its exit terminates (daemonic: DataLoader workers) or joins."""
    import sys
    out: set[int] = set()
    mp_util = sys.modules.get("multiprocessing.resource_tracker")
    tracker = getattr(getattr(mp_util, "_resource_tracker", None), "_pid", None)
    forkserver = getattr(getattr(sys.modules.get("multiprocessing.forkserver"), "_forkserver", None),
                         "_forkserver_pid", None)
    out |= {p for p in (tracker, forkserver) if isinstance(p, int)}
    compile_pools = getattr(sys.modules.get("torch._inductor.async_compile"), "_pool_set", ())
    for pool in list(compile_pools or ()):
        sidecar = getattr(getattr(pool, "process", None), "pid", None)  # SubprocPool
        out |= {sidecar} if isinstance(sidecar, int) else set()
        out |= {p for p in (getattr(pool, "_processes", None) or {}) if isinstance(p, int)}  # a process pool
    if interpreter_exits and "multiprocessing" in sys.modules:
        import multiprocessing
        out |= {p.pid for p in multiprocessing.active_children() if p.pid}
    return out
