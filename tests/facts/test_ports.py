"""facts/ports.py: who holds a port, and whether an error text says a bind failed because the
port is taken."""
from __future__ import annotations

import os
import socket
from types import SimpleNamespace

from helpers.procs import free_port

from ddp_doctor.facts import ports

TORCH_BIND = ("The server socket has failed to listen on any local network address. port: 47699, "
              "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")


def test_address_in_use_reads_torch_and_python_errors():
    assert ports.address_in_use(TORCH_BIND)
    assert ports.address_in_use("[Errno 98] Address already in use")
    assert ports.address_in_use("OSError: errno 98")
    assert ports.failed_port(TORCH_BIND) == 47699


def test_other_errors_are_not_a_port_in_use():
    for text in ("Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
                 "The client socket has failed to connect to any network address of (10.0.0.9, 29500). "
                 "code: -111, name: ECONNREFUSED, message: connection refused",
                 "port 29500 accepted connections", ""):
        assert not ports.address_in_use(text), text
    assert ports.failed_port("no port named here") is None
    assert ports.failed_port("port: 99999") is None


def _conn(port: int, pid: int | None, status: str = "LISTEN", host: str = "127.0.0.1"):
    return SimpleNamespace(laddr=(host, port), raddr=(), status=status, pid=pid)


def test_holders_from_names_the_listener_and_degrades_to_unknown():
    conns = [_conn(5000, 41), _conn(5000, 41, host="::1"), _conn(5000, None, host="0.0.0.0"),
             _conn(5001, 42), _conn(40000, 43, status="ESTABLISHED"),
             SimpleNamespace(laddr=(), raddr=(), status="NONE", pid=44)]
    got = ports.holders_from(conns, 5000, lambda pid: f"cmd-of-{pid}")
    assert [(h.pid, h.cmdline) for h in got] == [(41, "cmd-of-41"), (None, None)]
    assert got[0].describe() == "pid 41 (cmd-of-41)"
    assert "unknown process" in got[1].describe()
    assert ports.PortHolder(7).describe() == "pid 7 (command line not readable)"
    assert ports.holders_from(conns, 6000, lambda pid: "x") == []


def test_holders_from_falls_back_to_a_socket_bound_without_listening():
    conns = [_conn(5000, 51, status="NONE"), _conn(5000, 52, status="TIME_WAIT")]
    assert [h.pid for h in ports.holders_from(conns, 5000, lambda pid: None)] == [51, 52]
    conns.append(_conn(5000, 53))
    assert [h.pid for h in ports.holders_from(conns, 5000, lambda pid: None)] == [53]


def test_port_holders_names_this_process_for_a_socket_it_listens_on():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        got = ports.port_holders(port)
        assert [h.pid for h in got] == [os.getpid()], got
        assert got[0].cmdline and got[0].address == f"127.0.0.1:{port}"
    assert ports.port_holders(free_port()) == []
