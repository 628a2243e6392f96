"""Servers a test's rank starts and leaves listening: a plain child, one in its
own session, and a double-forked daemon (fork, setsid, fork: reparented away from the rank, in a
session of its own). Each listens on a port of 127.0.0.1 and writes "PID PORT" to DIR/KIND.pid once
it listens; each lives at most `life` seconds, so nothing outlives a failed test for long, and
each names its pid file on its command line (a test kills only what it started)."""
import os
import subprocess
import sys
import time

KINDS = ("plain", "session", "daemon")
SERVER = r"""
import os, socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
path = sys.argv[1]
with open(path + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {s.getsockname()[1]}")
os.replace(path + ".tmp", path)
time.sleep(float(sys.argv[2]))
"""
# the first two processes exit at once
DAEMON = r"""
import os, sys
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
"""


def start(kind: str, d: str, life: str) -> "subprocess.Popen | None":
    args = [sys.executable, "-c", SERVER, os.path.join(d, f"{kind}.pid"), life]
    if kind == "daemon":
        subprocess.run([sys.executable, "-c", DAEMON, *args[2:]], check=True)
        return None
    return subprocess.Popen(args, start_new_session=kind == "session")


def wait_listening(d: str, kinds=KINDS, bound: float = 60.0) -> None:
    """Until every server wrote its pid file (it listens then); SystemExit past the bound."""
    deadline = time.monotonic() + bound
    while not all(os.path.exists(os.path.join(d, f"{k}.pid")) for k in kinds):
        if time.monotonic() > deadline:
            raise SystemExit(f"leftover_servers: {kinds} did not start within {bound:g} s")
        time.sleep(0.02)
