"""facts/process_table.py: which processes a rank's script left (tree, session, group, environment mark;
never the rank's own, what existed before the script, or the interpreter's and torch's helpers),
and what each one listens on, read through psutil and through /proc alike."""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest
from helpers.procs import wait_for

from ddp_doctor.facts import process_table as lo
from ddp_doctor.facts.process_table import CHILD, DESCENDANT, GROUP, MARKED, SESSION, Proc

ROOT = 100


def table(*procs: Proc) -> dict[int, Proc]:
    return {p.pid: p for p in procs}


def p(pid, ppid, sid=ROOT, pgid=ROOT, started=1.0, **kw) -> Proc:
    return Proc(pid, ppid, sid, pgid, started, **kw)


# A rank (100) under its launcher (10, in session 1): a child, a grandchild, a double-forked daemon
# (init's, its own session) that carries the mark, a daemon in the rank's session that cleared its
# environment, and a stranger of the same user.
LAUNCHER = p(10, 1, sid=1, pgid=10)
RANK = p(ROOT, 10)
WORLD = table(p(1, 0, sid=1, pgid=1), LAUNCHER, RANK, p(101, ROOT), p(102, 101),
              p(103, 1, sid=103, pgid=103, marked=True), p(104, 1), p(200, 1, sid=200, pgid=200))


def test_children_descendants_reparented_and_session_members_are_found_each_by_how():
    assert lo.leftovers(WORLD, ROOT) == {101: CHILD, 102: DESCENDANT, 103: MARKED, 104: SESSION}


def test_the_rank_its_ancestors_strangers_and_zombies_are_never_leftovers():
    world = {**WORLD, 105: p(105, ROOT, zombie=True)}
    found = lo.leftovers(world, ROOT)
    assert not {1, 10, ROOT, 200, 105} & set(found)
    assert lo.leftovers(table(LAUNCHER, RANK), ROOT) == {}


def test_a_session_or_group_counts_only_where_the_rank_leads_it():
    # a rank in its launcher's session and group (a shell's job, the pytest pool's shared group)
    follower = table(p(1, 0, sid=1, pgid=1), p(10, 1, sid=1, pgid=10), p(ROOT, 10, sid=1, pgid=10),
                     p(104, 1, sid=1, pgid=10), p(101, ROOT, sid=1, pgid=10))
    assert lo.leftovers(follower, ROOT) == {101: CHILD}
    leader_of_group = table(p(ROOT, 10, sid=1, pgid=ROOT), p(104, 1, sid=1, pgid=ROOT))
    assert lo.leftovers(leader_of_group, ROOT) == {104: GROUP}
    assert lo.leftovers(leader_of_group, ROOT, by_group=False) == {}


def test_what_existed_before_the_script_and_what_it_starts_later_is_never_a_leftover():
    # `ddp-doctor run x.py | tee log`: tee is in the rank's group from the start; a child it starts
    # later is tee's, and the same pid reused by a new process after the script started is not
    before_world = table(p(ROOT, 10, sid=1, pgid=ROOT), p(300, 10, sid=1, pgid=ROOT, started=0.5),
                         p(301, ROOT, started=0.6))
    before = lo.before_script(before_world, ROOT)
    assert {pid for pid, _ in before} == {ROOT, 300, 301}
    later = {**before_world, 302: p(302, 300, sid=1, pgid=ROOT), 303: p(303, ROOT, sid=1, pgid=ROOT)}
    assert lo.leftovers(later, ROOT, before=before) == {303: CHILD}
    reused = {**later, 300: p(300, 1, sid=1, pgid=ROOT, started=9.0)}  # tee ended; its pid now someone else's
    del reused[302]
    assert lo.leftovers(reused, ROOT, before=before) == {300: GROUP, 303: CHILD}


def test_owned_helpers_and_everything_they_started_are_left_alone():
    world = {**WORLD, 110: p(110, ROOT), 111: p(111, 110)}  # torch's compile sidecar and its workers
    assert set(lo.leftovers(world, ROOT, owned={110})) == {101, 102, 103, 104}


# ---------------------------------------------------------------- real processes, psutil and /proc
SERVER = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
          "print(s.getsockname()[1], flush=True); time.sleep(60)")


@pytest.fixture
def server():
    """A real child that listens on a port, marked as a rank's script child would be."""
    env = {**os.environ, lo.MARK_ENV: "m-test"}
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        port = int(proc.stdout.readline())  # the line comes once it listens
        yield proc, port
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


@pytest.mark.parametrize("source", ["psutil", "proc"])
def test_a_real_child_is_read_with_its_mark_and_its_listening_port(server, source, monkeypatch):
    proc, port = server
    if source == "proc":
        monkeypatch.setattr(lo, "_psutil", lambda: None)
    procs = lo.process_table("m-test")
    assert procs[proc.pid].ppid == os.getpid() and procs[proc.pid].marked
    assert not procs[os.getpid()].marked  # a mark set after a process started is not in its environ
    assert not lo.process_table("other")[proc.pid].marked
    assert lo.process(proc.pid).started == procs[proc.pid].started
    assert lo.listening_ports(proc.pid) == [f"127.0.0.1:{port}"]
    assert f"127.0.0.1:{port}" not in lo.listening_ports(os.getpid())  # the child's port is the child's
    assert "time.sleep(60)" in (lo.command_line(proc.pid) or "")
    proc.kill()
    proc.wait()
    assert lo.process(proc.pid) is None


def test_proc_addresses_decode_ipv4_and_ipv6():
    # /proc/net/tcp prints each 32-bit word in host byte order (little-endian on x86 and arm64)
    if sys.byteorder == "little":
        assert lo._hex_address("0100007F:1F90") == ("127.0.0.1", 8080)
        assert lo._hex_address("00000000000000000000000001000000:0016") == ("::1", 22)


def _sleep() -> None:
    import time
    time.sleep(60)


def test_multiprocessing_children_are_the_interpreters_only_when_its_exit_runs():
    child = multiprocessing.get_context("fork").Process(target=_sleep, daemon=True)
    child.start()
    try:
        wait_for(lambda: child.pid, 10, "the child's pid")
        assert child.pid in lo.own_helpers()
        assert child.pid not in lo.own_helpers(interpreter_exits=False)
    finally:
        child.kill()
        child.join(10)
