"""processes/tcp_store.py: a store operation runs on its caller's thread, watched by the process's one
watchdog, which ends one past its bound by shutting its connection down; where no connection is
known, a thread's operations go through one long-lived worker (no thread per operation), and
one that overruns leaves the worker blocked and the thread's later operations fail at once.
Against a real TCPStore whose host is stopped (SIGSTOP): torch's client alone would wait on
forever."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from ddp_doctor.processes.tcp_store import StoreGuard, StoreTimeout, connect_store, store_call, wait_keys

torch_dist = pytest.importorskip("torch.distributed")


def test_calls_run_on_one_worker_not_a_thread_each():
    guard = StoreGuard()
    assert guard.call(lambda: 41 + 1, "add", 5.0) == 42
    before = threading.active_count()
    names = {guard.call(lambda: threading.current_thread().name, "get", 5.0) for _ in range(200)}
    assert names == {"ddp-doctor-store-guard"} and threading.active_count() <= before  # (an idle one may end)
    with pytest.raises(KeyError):  # the call's own error reaches the caller
        guard.call(lambda: {}["k"], "get", 5.0)


def test_an_operation_past_its_bound_fails_and_so_do_the_later_ones_at_once():
    guard = StoreGuard()
    release = threading.Event()
    with pytest.raises(StoreTimeout, match="did not answer get.'verdict'. within 0.5 s"):
        guard.call(lambda: release.wait(30), "get('verdict')", 0.5)
    # at once: had it queued behind the stuck call, it would time out after 30 s with another message
    with pytest.raises(StoreTimeout, match="an earlier call .get.'verdict'.. still waits"):
        guard.call(lambda: 1, "add", 30.0)
    release.set()


@pytest.fixture(scope="module")
def store_process():
    """One process that hosts the slow tests' TCPStores, a new one on a port of its own for each
    test: a test stops it (SIGSTOP) and store_host resumes it after, so the tests share one
    interpreter's torch import instead of starting one each."""
    from helpers.procs import wait_for_line
    host = subprocess.Popen([sys.executable, "-c", (
        "import sys, torch.distributed as d\n"
        "stores = []\n"
        "print('up', flush=True)\n"
        "for line in sys.stdin:\n"
        "    stores.append(d.TCPStore('127.0.0.1', int(line), is_master=True, wait_for_workers=False))\n"
        "    print('up', flush=True)\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        wait_for_line(host.stdout, "^up$", 120)
        yield host
    finally:
        host.kill()
        host.wait(10)


@pytest.fixture
def store_host(store_process):
    """(the host's pid, the port of a store it now serves); the host runs again after the test,
    whatever the test did to it."""
    from helpers.procs import free_port, wait_for_line
    port = free_port()
    store_process.stdin.write(f"{port}\n")
    store_process.stdin.flush()
    wait_for_line(store_process.stdout, "^up$", 60)
    try:
        yield store_process.pid, port
    finally:
        os.kill(store_process.pid, signal.SIGCONT)


@pytest.mark.slow
def test_a_stopped_store_host_is_a_bounded_timeout_not_a_hang(store_host):
    pid, port = store_host
    client = connect_store("127.0.0.1", port, hosting=False, timeout=2.0)  # as a rank connects
    errors: list[BaseException] = []

    def rank() -> None:  # a rank's thread, with its own guard
        try:
            assert store_call(lambda: client.add("n", 1), "add", 2.0) == 1
            os.kill(pid, signal.SIGSTOP)
            # a running host would answer this wait at its 2 s (False, no error): only a stopped
            # one leaves it to the operation's bound (StoreTimeout)
            wait_keys(client, ["never"], "a key nobody writes", time.monotonic() + 2.0)
        except BaseException as e:  # noqa: BLE001 - read below
            errors.append(e)
    t = threading.Thread(target=rank)
    start = time.monotonic()
    t.start()
    t.join(60)
    assert not t.is_alive() and len(errors) == 1 and isinstance(errors[0], StoreTimeout), errors
    assert time.monotonic() - start < 30  # the wait's 2 s and an operation's bound on it


def _stop(pid: int) -> None:
    """SIGSTOP, and wait (bounded) until the process is stopped: a thread of it running on another
    core stops at its next chance, and may answer one more request meanwhile."""
    from helpers.procs import wait_for
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T", 10.0,
             "the store host to stop", interval=0.01)


@pytest.mark.slow
def test_the_watchdog_ends_a_call_on_a_stopped_host_on_the_callers_own_thread(store_host):
    """A client made by connect_store is watched: its calls run on the caller's thread (no worker,
    no thread per call), and one the store never answers is ended by shutting its connection
    down: StoreTimeout within the bound, and the later calls fail at once."""
    from ddp_doctor.processes import tcp_store as st
    pid, port = store_host
    client = st.connect_store("127.0.0.1", port, hosting=False, timeout=5.0)
    assert st._WATCHDOG.watches()
    threads = []
    assert store_call(lambda: (threads.append(threading.current_thread()), client.add("n", 1))[1], "add", 2.0) == 1
    assert threads == [threading.current_thread()]  # run where it was called
    _stop(pid)
    start = time.monotonic()
    with pytest.raises(StoreTimeout, match="did not answer add.'n'. within 1 s"):
        store_call(lambda: client.add("n", 1), "add('n')", 1.0)
    assert time.monotonic() - start < 30  # the bound and a tick, not forever
    with pytest.raises((RuntimeError, StoreTimeout)):  # the connection is shut: no second wait
        store_call(lambda: client.get("n"), "get('n')", 1.0)


@pytest.mark.slow
@pytest.mark.parametrize(("rank", "stop"), [(1, "before its check-in"), (1, "while it waits"),
                                           (0, "before its check-in")])
def test_a_rank_that_meets_at_a_stopped_store_host_ends_at_the_meetings_bound(store_host, rank, stop):
    """A rank other than 0 checks in and waits for the others under one bound (the meeting's
    timeout and an operation's bound): a store host that stops before its check-in, or while it
    waits, ends its meeting with StoreTimeout at that bound, not a hang. Rank 0 waits for the
    views apart: its check-in alone has an operation's bound."""
    from helpers.procs import wait_for

    from ddp_doctor.preflight_ranks import bounded_rendezvous as rendezvous
    from ddp_doctor.processes import tcp_store as st
    pid, port = store_host
    client = st.connect_store("127.0.0.1", port, hosting=False, timeout=5.0)
    look = torch_dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)  # the test's own
    if stop == "before its check-in":
        _stop(pid)
    errors: list[BaseException] = []

    def meet() -> None:
        try:
            rendezvous.meet(client, rank, 2, {"rank": rank, "hostname": "h", "pid": 1}, 2.0)
        except BaseException as e:  # noqa: BLE001 - read below
            errors.append(e)
    t = threading.Thread(target=meet)
    start = time.monotonic()
    t.start()
    if stop == "while it waits":  # once its check-in is in the store
        wait_for(lambda: bool(look.check([f"view/{rank}"])), 10.0, "the rank's check-in", interval=0.01)
        _stop(pid)
    t.join(60)
    assert not t.is_alive() and len(errors) == 1 and isinstance(errors[0], StoreTimeout), errors
    said = str(errors[0])  # the meeting's 2 s and an operation's 2 s; rank 0's check-in: 2 s
    assert "the check-in" in said and ("within 4 s" if rank else "within 2 s") in said, said
    assert time.monotonic() - start < 30  # the meeting's 2 s, an operation's bound and a tick


def test_the_watchdog_never_shuts_a_socket_whose_number_was_given_to_another(tmp_path):
    """A closed connection's fd number may be reused: the watchdog shuts a socket down only while
    its /proc link is the one it noted."""
    import socket as so

    from ddp_doctor.processes.tcp_store import _shut_down, _socket_links
    a, b = so.socketpair()
    try:
        link = _socket_links()[a.fileno()]
        _shut_down(a.fileno(), "socket:[0]")  # another socket's link: left alone
        b.sendall(b"x")
        assert a.recv(1) == b"x"
        _shut_down(a.fileno(), link)  # its own: shut down, the peer reads the end
        assert b.recv(1) == b""
    finally:
        a.close()
        b.close()


def test_only_the_stores_own_connections_are_noted():
    """connect_store notes the new sockets connected to the store's port, and no other: not a
    unix socket, not a listener, not a connection elsewhere made meanwhile."""
    import socket as so

    from helpers.procs import free_port

    from ddp_doctor.processes import tcp_store as st
    port = free_port()
    other = so.socket()
    other.bind(("127.0.0.1", 0))
    other.listen()
    pair = []
    before = dict(st._WATCHDOG._sockets)  # an earlier test's client may still be open
    with st._WATCHDOG.connecting(port):
        pair += so.socketpair()  # a unix socket made meanwhile
        elsewhere = so.create_connection(other.getsockname())
        host = st.connect_store("127.0.0.1", port, hosting=True, timeout=5.0)
    try:
        noted = {fd: link for fd, link in st._WATCHDOG._sockets.items() if before.get(fd) != link}
        assert not {p.fileno() for p in pair} & set(noted) and elsewhere.fileno() not in noted
        assert noted and all(st._peer_port(fd) == port for fd in noted)
        assert store_call(lambda: host.add("n", 1), "add", 5.0) == 1
    finally:
        elsewhere.close()
        other.close()
        for p in pair:
            p.close()


def test_a_forked_child_starts_with_a_watchdog_of_its_own():
    """The parent's noted connections and its watchdog's lock are not the child's (a DataLoader
    worker, a forked rank): the child's calls run, unwatched until it connects."""
    import socket as so

    from ddp_doctor.processes import tcp_store as st
    a, b = so.socketpair()
    st._WATCHDOG._sockets[a.fileno()] = st._socket_links()[a.fileno()]  # the parent watches one
    try:
        with st._WATCHDOG._lock:  # held by another thread at the fork
            pid = os.fork()
            if pid == 0:
                ok = False
                try:
                    ok = not st._WATCHDOG.watches() and store_call(lambda: 7, "x", 2.0) == 7
                finally:
                    os._exit(0 if ok else 1)
        from helpers.procs import wait_for
        ended: list[int] = []
        try:
            wait_for(lambda: ended.extend(x for x in [os.waitpid(pid, os.WNOHANG)] if x[0]) or ended, 30.0,
                     "the forked child to end (stuck on its parent's watchdog lock?)")
        except AssertionError:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
        assert os.waitstatus_to_exitcode(ended[0][1]) == 0
    finally:
        st._WATCHDOG._sockets.pop(a.fileno(), None)
        a.close()
        b.close()


@pytest.mark.slow
def test_a_watchdog_whose_thread_ended_idle_watches_the_next_call_again():
    """The watch thread ends after IDLE_S without a call; the next call starts another, which ends
    that call past its bound by shutting its connection down (a socket pair stands for a store
    connection that never answers)."""
    import socket as so

    from helpers.procs import wait_for

    from ddp_doctor.processes.tcp_store import StoreWatchdog, _socket_links
    dog = StoreWatchdog()
    dog.IDLE_S = 0.2
    a, b = so.socketpair()
    try:
        dog._sockets = {a.fileno(): _socket_links()[a.fileno()]}
        assert dog.call(lambda: 7, "add", 5.0) == 7
        first = dog._thread
        wait_for(lambda: dog._thread is None and not first.is_alive(), 30.0, "the idle watch thread to end")
        errors: list[BaseException] = []

        def blocked() -> None:  # no answer ever comes: only a watch ends it
            try:
                dog.call(lambda: a.recv(1), "get", 0.5)
            except BaseException as e:  # noqa: BLE001 - looked at below
                errors.append(e)
        caller = threading.Thread(target=blocked, daemon=True)
        caller.start()
        caller.join(30)
        ended = not caller.is_alive()
    finally:
        b.close()  # ends a call no watch ended, so that a failing test does not hang
        a.close()
    assert ended and len(errors) == 1 and isinstance(errors[0], StoreTimeout), errors
    assert "did not answer get within 0.5 s" in str(errors[0]) and dog._thread is not first


def test_calls_from_many_threads_at_once_are_noted_and_taken_back_without_a_lock():
    """Hundreds of threads of one process call at once (a rank's threads, the scale bench's
    simulated ranks): each gets its own value, and every note is taken back by its call (none is
    left for the watch to find late, none raises)."""
    from ddp_doctor.processes.tcp_store import StoreWatchdog
    dog = StoreWatchdog()
    start, inside = threading.Barrier(200), threading.Barrier(200)  # every call open at once
    got: dict[int, object] = {}

    def one(i: int) -> None:
        start.wait(30)
        try:
            got[i] = dog.call(lambda: (inside.wait(30), i)[1], "add", 60.0)
        except BaseException as e:  # noqa: BLE001 - looked at below
            got[i] = e
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == {i: i for i in range(200)} and dog._open == {}


def test_a_call_the_watch_took_past_its_deadline_is_a_timeout_even_if_it_then_returns():
    """The watch and the call both try to take the call's note back: whoever takes it owns it. A
    call whose note the watch took (past its deadline, its connections shut down) raises
    StoreTimeout, even when what it ran returns a value afterwards."""
    from helpers.procs import wait_for

    from ddp_doctor.processes.tcp_store import StoreWatchdog
    dog = StoreWatchdog()
    dog.TICK_S = 0.05
    taken = threading.Event()

    def slow() -> int:  # returns only once the watch has taken this call's note
        wait_for(lambda: not dog._open, 30.0, "the watch to take the late call")
        taken.set()
        return 5
    with pytest.raises(StoreTimeout, match="did not answer get within 0.1 s"):
        dog.call(slow, "get", 0.1)
    assert taken.is_set() and dog.call(lambda: 6, "get", 30.0) == 6  # the next call is its own


def test_an_idle_guard_worker_ends_quietly_and_the_next_call_starts_another(monkeypatch):
    """A thread's guard worker ends after IDLE_S without work, with no error of its own (an
    exception there would print a traceback on the rank's stderr), and the next call is served."""
    from helpers.procs import wait_for
    raised: list[object] = []
    monkeypatch.setattr(threading, "excepthook", raised.append)
    guard = StoreGuard()
    guard.IDLE_S = 0.2
    assert guard.call(lambda: 1, "add", 5.0) == 1
    first = guard._worker
    wait_for(lambda: guard._worker is None and not first.is_alive(), 30.0, "the idle worker to end")
    assert guard.call(lambda: 2, "add", 5.0) == 2 and guard._worker is not first
    assert raised == []


@pytest.mark.slow
def test_wait_closed_sees_the_host_close_without_a_store_call():
    """A rank's wait for rank 0's preflight store to go (one_rank._await_verdict) reads its own
    socket's end-of-file: no store operation, so torch logs no C++ warning when the server goes."""
    from helpers.procs import free_port
    script = (
        "import gc, sys, time\n"
        "import torch.distributed as d\n"
        "from ddp_doctor.processes.tcp_store import wait_closed\n"
        f"port = {free_port()}\n"
        "host = d.TCPStore('127.0.0.1', port, is_master=True, wait_for_workers=False)\n"
        "client = d.TCPStore('127.0.0.1', port, is_master=False)\n"
        "client.set('k', 'v')\n"
        "print('open', wait_closed(port, 0.2), flush=True)\n"  # the host still serves: bound reached
        "del host\n"
        "gc.collect()\n"
        "print('closed', wait_closed(port, 30.0), flush=True)\n"
        "print('none', wait_closed(1, 0.1), flush=True)\n")  # no connection to that port: nothing to wait for
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.stdout.split() == ["open", "False", "closed", "True", "none", "True"], res.stdout + res.stderr
    assert "TCPStore.cpp" not in res.stderr, res.stderr
