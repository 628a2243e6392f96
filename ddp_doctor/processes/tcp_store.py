"""The bounded client of torch's TCPStore, the key-value store the ranks of a job meet at: the
preflight's rendezvous (preflight_ranks/bounded_rendezvous.py) and the ranks' endings across nodes
(training/run/endings.py) go through it.

torch's store client has no bound of its own on its handshake or on an operation (a listener that
accepts and never answers blocks it forever; a stopped store host, measured: an add or a check
waits on past the client's own timeout). The handshake runs through call_with_time_limit. An
operation runs on its caller's thread, watched by the process's one watchdog (StoreWatchdog):
past its bound the watchdog shuts down the connections connect_store made (their sockets, known
by their /proc link), which makes the blocked call return with an error, and the call raises
StoreTimeout. No thread per operation and no hand-off between threads: a rank's store call costs
what torch's does. Where the connections cannot be known (no /proc, a store made elsewhere) the
operations of a thread go through that thread's one guard instead (StoreGuard): a long-lived
worker that runs them in turn while the caller waits within the bound; past it the guard is
broken and every later operation of that thread fails at once (a rank process ends with
os._exit, which the worker cannot hold up).

Waiting for other ranks is the store's own: `wait` on the keys, answered by the store when they
exist (one request for the whole wait: wait_keys), never a poll of every key every few
milliseconds; and what is read once they exist is read in one request (multi_get).
"""
from __future__ import annotations

import itertools
import json
import os
import queue
import socket
import threading
import time
from datetime import timedelta
from typing import Any, Callable, TypeVar

from ddp_doctor.time_limit import call_with_time_limit

CONNECT_MARGIN_S = 2.0  # past torch's own connect timeout, before the connection is given up
T = TypeVar("T")


class StoreTimeout(TimeoutError):
    """A store call that did not return within its bound (its thread is abandoned)."""


def connect_store(host: str, port: int, *, hosting: bool, timeout: float) -> Any:
    """Host (rank 0) or join the store, within `timeout` (+ a margin): torch's client retries its
    connection for `timeout` but then waits for its handshake's answer without any bound."""
    import torch.distributed as dist
    bound = timeout + CONNECT_MARGIN_S
    with _WATCHDOG.connecting(port):
        out = call_with_time_limit(lambda: dist.TCPStore(
            host, port, world_size=None, is_master=hosting, timeout=timedelta(seconds=timeout),
            wait_for_workers=False), bound, name="ddp-doctor-store-connect")
    if not out.finished:
        raise StoreTimeout(f"no store answered at {host}:{port} within {bound:g} s")
    if out.error is not None:
        raise out.error
    return out.value


_FD_DIR = "/proc/self/fd"


def _socket_links() -> dict[int, str]:
    """This process's sockets: fd -> its /proc link ("socket:[inode]", the same while it lives)."""
    out: dict[int, str] = {}
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return out
    for name in names:
        try:
            link = os.readlink(f"{_FD_DIR}/{name}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:"):
            out[int(name)] = link
    return out


def _peer_port(fd: int) -> int | None:
    """The port at the other end of an IP connection on fd; None for anything else."""
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            if s.family not in (socket.AF_INET, socket.AF_INET6):
                return None
            return int(s.getpeername()[1])
    except OSError:  # not connected (a listener), or gone
        return None


class StoreWatchdog:
    """The process's one watchdog over its store calls (see the module's doc): each call is noted
    with its deadline while it runs on its caller's thread; a thread looks at the notes every
    TICK_S while any is open, and past a deadline shuts down the store connections it knows."""

    TICK_S = 0.2
    IDLE_S = 30.0  # the thread ends after this long without a call (made again on the next)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._open: dict[int, float] = {}  # call -> its deadline (monotonic): popped by the call or the watch
        self._sockets: dict[int, str] = {}  # fd -> /proc link of each store connection (client side)
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None
        self._idle = True

    def watches(self) -> bool:
        """Whether there is a connection to shut down (else a call it watched could not be ended)."""
        return bool(self._sockets)

    class _Connecting:
        def __init__(self, dog: StoreWatchdog, port: int) -> None:
            self.dog, self.port, self.before = dog, port, {}

        def __enter__(self) -> None:
            self.before = _socket_links()

        def __exit__(self, *exc: object) -> None:
            # the new sockets connected to the store's port are its clients' (a host's own
            # listener and the connections it accepted are not); another thread's connection to
            # the same store made meanwhile is one of its clients too
            after = _socket_links()
            new = {fd: link for fd, link in after.items() if self.before.get(fd) != link}
            mine = {fd: link for fd, link in new.items() if _peer_port(fd) == self.port}
            with self.dog._lock:  # connections closed since are forgotten
                self.dog._sockets = {fd: link for fd, link in self.dog._sockets.items() if after.get(fd) == link}
                self.dog._sockets.update(mine)

    def connecting(self, port: int) -> StoreWatchdog._Connecting:
        """`with watchdog.connecting(port): <make a client of the store at port>`: its connection is
        noted, to be shut down should a call past its bound hang on it."""
        return self._Connecting(self, port)

    def call(self, fn: Callable[[], T], what: str, bound: float) -> T:
        # no lock on a call's way: hundreds of a process's threads may call at once (a lock held
        # as the interpreter switches threads queues them all behind it); a note is one dict
        # operation, and whoever pops it first owns it: the call (it came back in time) or the
        # watch (past its deadline, it shuts the connections down)
        token = next(self._tokens)
        self._open[token] = time.monotonic() + bound
        if self._idle:  # the watch sleeps, or has ended: once after an idle spell
            self._rouse()
        try:
            value = fn()
        except BaseException:
            if self._open.pop(token, None) is None:  # the watch took it: ended by the shut down
                raise StoreTimeout(f"the store did not answer {what} within {bound:g} s") from None
            raise
        if self._open.pop(token, None) is None:  # it came back only because its connection was shut down
            raise StoreTimeout(f"the store did not answer {what} within {bound:g} s")
        return value

    def _rouse(self) -> None:
        with self._lock:  # the thread ends only under this lock, and only while no call is noted
            self._idle = False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ddp-doctor-store-watchdog", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        try:
            self._watch()
        finally:  # ended by an error, not idle: the next call finds no watch and starts another
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None
                    self._idle = True

    def _watch(self) -> None:
        while True:
            if not self._open:
                self._wake.clear()
                self._idle = True
                # a call noted before `idle` was set read it unset and woke nobody: look again
                # (a call noted after reads it set and wakes this thread)
                if not self._open:
                    if not self._wake.wait(self.IDLE_S):
                        with self._lock:
                            if self._idle and not self._open:  # a call from now on starts another
                                self._thread = None
                                return
                    continue
                self._idle = False
            time.sleep(self.TICK_S)  # the watch's tick: a deadline is met within it
            now = time.monotonic()
            late = [t for t, deadline in self._open.copy().items() if deadline <= now]
            taken = [t for t in late if self._open.pop(t, None) is not None]  # those the calls did not take back
            if taken:
                with self._lock:
                    sockets, self._sockets = self._sockets, {}
                for fd, link in sockets.items():
                    _shut_down(fd, link)


def _shut_down(fd: int, link: str) -> None:
    """Shut down the connection on fd if fd is still that socket (a closed fd's number may have
    been given to another): a call blocked reading it then returns with an error."""
    try:
        if os.readlink(f"{_FD_DIR}/{fd}") != link:
            return
        with socket.socket(fileno=os.dup(fd)) as s:
            s.shutdown(socket.SHUT_RDWR)
    except OSError:  # closed meanwhile: nothing left to end
        pass


_WATCHDOG = StoreWatchdog()
if hasattr(os, "register_at_fork"):  # a forked child has none of the parent's threads or connections
    os.register_at_fork(after_in_child=_WATCHDOG.__init__)


class StoreGuard:
    """One worker thread that runs a caller thread's store operations in turn, each within its
    bound (see the module's doc). It ends after IDLE_S without work (made again on the next)."""

    IDLE_S = 30.0

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self.stuck: str | None = None  # the operation the worker is blocked in, once one overran

    def call(self, fn: Callable[[], T], what: str, bound: float) -> T:
        if self.stuck is not None:
            raise StoreTimeout(f"the store did not answer {what}: an earlier call ({self.stuck}) still waits")
        done = threading.Event()
        out: list[Any] = [None, None]
        self._jobs.put((fn, out, done))
        self._ensure_worker()
        if not done.wait(bound):
            self.stuck = what
            raise StoreTimeout(f"the store did not answer {what} within {bound:g} s")
        if out[1] is not None:
            raise out[1]
        return out[0]  # type: ignore[no-any-return]

    def _ensure_worker(self) -> None:
        with self._lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._run, name="ddp-doctor-store-guard", daemon=True)
                self._worker.start()

    def _run(self) -> None:
        while True:
            try:
                fn, out, done = self._jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():  # a job put now finds no live worker and starts one
                        self._worker = None
                        return
                continue
            try:
                out[0] = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the caller, never raised here
                out[1] = e
            done.set()


_guards = threading.local()


def _guard() -> StoreGuard:
    g = getattr(_guards, "guard", None)
    if g is None:
        g = _guards.guard = StoreGuard()
    return g


def store_call(fn: Callable[[], T], what: str, bound: float) -> T:
    """One store operation, bounded: torch's client waits forever on a store that stopped
    answering (a hung or stopped host). Past `bound` it raises StoreTimeout: the watchdog shut
    the connections down (or, without one to shut down, this thread's guard is left blocked): the
    later calls fail too."""
    if _WATCHDOG.watches():
        return _WATCHDOG.call(fn, what, max(0.5, bound))
    return _guard().call(fn, what, max(0.5, bound))


def wait_keys(store: Any, keys: list[str], what: str, deadline: float) -> bool:
    """Wait, on the store's side, until every key exists or the deadline passes: one request
    however many keys, answered as soon as they exist. True when they all exist.

    One wait for the whole time, not a wait a second: torch's client cancels a wait that timed
    out, and the store then releases the waiters late (measured, torch 2.13: 100 clients waiting a
    second at a time were released 8.5 s after their key was set, against 7 ms for one wait
    each). The wait holds the client's connection meanwhile: a process group that shares it
    (NCCL's monitor thread looks at the store now and then) waits its turn."""
    remaining = deadline - time.monotonic()
    if remaining > 0:
        try:  # a busy store answers late: the margin is an operation's bound on the time waited
            store_call(lambda: store.wait(keys, timedelta(seconds=remaining)), f"wait({what})",
                       remaining + op_bound(remaining))
            return True
        except StoreTimeout:
            raise
        except Exception:  # noqa: BLE001 - torch says "wait timeout" in several ways; a lost store
            pass  # fails the check below
    return bool(store_call(lambda: store.check(keys), f"check({what})", op_bound(1.0)))


def wait_closed(port: int, bound: float) -> bool:
    """Wait up to `bound` seconds for the server on `port` to close this process's connections to
    it (its store client's): True once one of them reads end-of-file, or when there is none. Read
    from the sockets themselves (a peek, never a read: the bytes stay the client's), because any
    store operation on a server that goes away fails loudly (torch logs a warning with its C++
    stack on stderr)."""
    import select
    fds = [fd for fd in _socket_links() if _peer_port(fd) == port]
    if not fds:
        return True
    poller = select.poll()
    gone = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)
    for fd in fds:
        poller.register(fd, select.POLLIN | gone)
    deadline = time.monotonic() + bound
    while (left := deadline - time.monotonic()) > 0:
        for fd, events in poller.poll(max(1, int(left * 1000))):
            if events & gone:
                return True
            try:
                with socket.socket(fileno=os.dup(fd)) as s:
                    if s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                        return True
            except BlockingIOError:
                continue
            except OSError:  # reset by the peer, or closed under us: gone either way
                return True
            poller.unregister(fd)  # bytes for the client (not ours to read): no end-of-file to see here
    return False


def op_bound(timeout: float) -> float:
    """How long one store operation may take: far above a working store's milliseconds."""
    return max(2.0, min(timeout, 30.0))


def prefixed(store: Any, prefix: str) -> Any:
    import torch.distributed as dist
    return dist.PrefixStore(prefix, store)


def read_keys(store: Any, keys: list[str], deadline: float, *, present: bool = False) -> dict[str, bytes]:
    """The values of the keys that appear before the deadline; the absent ones are left out. The
    store answers when they all exist (one wait), and they are read in one request; at the
    deadline, those there are read one by one. `present`: the caller knows every key exists (a
    wait for them was answered): they are read at once, without that wait."""
    if not keys:
        return {}
    bound = op_bound(deadline - time.monotonic())
    if present or wait_keys(store, keys, f"{len(keys)} key(s)", deadline):
        if hasattr(store, "multi_get"):  # torch >= 2.4
            values = store_call(lambda: store.multi_get(keys), f"multi_get({len(keys)} key(s))", bound)
        else:
            values = [store_call(lambda k=k: store.get(k), f"get({k!r})", bound) for k in keys]
        return dict(zip(keys, values))
    out: dict[str, bytes] = {}
    for k in keys:
        if store_call(lambda k=k: store.check([k]), f"check({k!r})", bound):
            out[k] = store_call(lambda k=k: store.get(k), f"get({k!r})", bound)
    return out


def read_json_keys(store: Any, keys: list[str], deadline: float, *, present: bool = False) -> dict[str, Any]:
    """read_keys, each value parsed as JSON."""
    return {k: json.loads(v.decode("utf-8")) for k, v in read_keys(store, keys, deadline, present=present).items()}
