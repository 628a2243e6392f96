"""Something that is not a torch store holds MASTER_PORT: a non-zero rank must
say what answered there within the --timeout bound, never wait in torch's store handshake forever.

Real peers: `python -m http.server` (answers HTTP, never torch's binary handshake) and a listening
socket that accepts and never says a word."""
from __future__ import annotations

import socket
import sys
import threading

import pytest
from helpers.procs import (
    assert_clean_output,
    clean_env,
    finish,
    free_port,
    kill_tree,
    load_json,
    run_ranks,
    start,
    wait_for,
)

pytestmark = pytest.mark.slow
BOUND = 5


def listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _preflight_rank1(tmp_path, port: int):
    report = tmp_path / "r.json"
    res = run_ranks(2, ["preflight", "--timeout", str(BOUND), "--report", str(report)], clean_env(),
                    str(tmp_path), port=port, ranks=[1], timeout=60.0)[1]
    assert res.rc == 3, res.output  # run_ranks fails the test if the rank is still waiting at 60 s
    assert_clean_output(res)
    own = load_json(str(report) + ".rank1.json")
    assert own["root_cause"]["id"] == "DDP315", own["findings"]
    found = next(f for f in own["findings"] if f["id"] == "DDP315")
    assert f"MASTER_PORT={port}" in found["message"] and "DDP313" in found["hint"]
    # within the --timeout bound: the one the rank applied, and torch's handshake ended (failed, or
    # abandoned by that bound), never a wait in it for good
    assert found["evidence"]["bound_s"] == BOUND, found
    assert "torch's store handshake failed" in found["message"] or "handshake got no answer" in found["message"]
    return res, found


def test_http_server_on_master_port_is_named(tmp_path):
    port = free_port()
    server = start([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], clean_env(),
                   str(tmp_path))
    try:
        wait_for(lambda: listens(port), 60, f"http.server to listen on port {port}")
        res, found = _preflight_rank1(tmp_path, port)
    finally:
        kill_tree(server.pid)
        finish(server, 10)
    assert "HTTP/1.0" in found["evidence"]["answer"] and found["evidence"]["silent"] is False
    assert "SimpleHTTP" in found["message"]
    print(f"http.server on MASTER_PORT: exit {res.rc} after {res.seconds:.1f} s")


def test_silent_listener_on_master_port_is_named(tmp_path):
    port = free_port()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_say_nothing() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept_and_say_nothing, daemon=True)
    t.start()
    try:
        res, found = _preflight_rank1(tmp_path, port)
    finally:
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        listener.close()
    assert held, "the rank never connected"
    assert found["evidence"]["silent"] is True and "silent" in found["message"]
    print(f"silent listener on MASTER_PORT: exit {res.rc} after {res.seconds:.1f} s")
