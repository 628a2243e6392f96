"""The processes a rank's script leaves running, ended at the rank's end and recorded for the
report (DDP816-DDP818, checks/leftover_rules.py).

    watch = watch_children()        # before the script: the mark in the environment, what exists
    ...the script...
    record = watch.end()            # after it: find (facts/process_table.py), describe, end, record

Each leftover is described before it is touched (pid, command line redacted, the TCP ports it
listens on, how it was found, the script's line that started it where the probes saw it), then
sent SIGTERM; what is alive after GRACE seconds gets SIGKILL; a process that escapes even that is
recorded as still running. A leftover may start more while it is ended, so the search runs again,
at most ROUNDS times. Every wait is bounded, a pid is signalled
only while it is still the process that was found (same start time), and nothing here raises: a
failure is recorded (DDP818) and the rank ends as it would have.
"""
from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, MutableMapping

from ddp_doctor.facts import process_table as facts
from ddp_doctor.processes.tree import adopt_orphans

GRACE = 2.0      # seconds a leftover gets to end after SIGTERM
KILL_WAIT = 2.0  # seconds to see it gone after SIGKILL
ROUNDS = 3       # searches: a leftover may start others while it is ended
POLL = 0.02


@dataclass
class ChildWatch:
    """What a rank needs at its end to find what its script left: the mark its processes carry and
    what existed before the script (never a leftover). The rank is a child subreaper from then
    on (watch_children), so what its script's processes orphan is reparented to it."""
    mark: str | None
    root: int
    before: frozenset[tuple[int, float]] = frozenset()
    by_group: bool = True
    error: str | None = None
    ended: list[dict[str, Any]] = field(default_factory=list)

    def end(self, *, grace: float = GRACE, interpreter_exits: bool = True) -> dict[str, Any] | None:
        """Find, describe and end what the script left; None when it left nothing. The record
        (in the rank's outcome) is {"processes": [...], "grace": s} and "error" when the search
        failed. `interpreter_exits`: False where the rank ends with os._exit (the pytest rank
        pool): multiprocessing's exit does not run, so its daemonic children are ended here as it
        would end them, and its other children are leftovers (nobody joins them)."""
        if self.error is None:
            try:
                own = _python_exit(interpreter_exits) | _ended_at_exit()
                for _ in range(ROUNDS):
                    table = facts.process_table(self.mark)
                    found = facts.leftovers(table, self.root, before=self.before, by_group=self.by_group,
                                            owned=own | facts.own_helpers(interpreter_exits=interpreter_exits))
                    found = {pid: how for pid, how in found.items() if pid not in {p["pid"] for p in self.ended}}
                    if not found:
                        break
                    self.ended += _end(table, found, grace)
            except Exception as e:  # noqa: BLE001 - the rank ends as it would have; the report says why
                self.error = f"{type(e).__name__}: {e}"
        if not self.ended and self.error is None:
            return None
        out: dict[str, Any] = {"processes": self.ended, "grace": grace}
        if self.error is not None:
            out["error"] = self.error
        return out


def watch_children(*, by_group: bool = True, environ: MutableMapping[str, str] | None = None,
                   adopt: bool | None = None) -> ChildWatch:
    """Before the script runs: put a mark unique to this rank in its environment (the processes the
    script starts inherit it) and note what exists (the rank's children, its session's and group's
    members): never leftovers. `by_group=False` where the rank shares its process group with its
    peers (the pytest rank pool). `adopt` (default: when the mark goes in this process's own
    environment): this process becomes a child subreaper for the rest of its life, so what the
    script's processes orphan (a double-forked daemon) is reparented to it. Never raises."""
    env = os.environ if environ is None else environ
    root = os.getpid()
    mark = uuid.uuid4().hex
    try:
        env[facts.MARK_ENV] = mark
        # A daemon that double-forks, calls setsid and clears its environment escapes the tree, the
        # session, the group and the mark: as a child subreaper the rank adopts it when its parent
        # exits, so it is the rank's child when the script ends (Linux; elsewhere the other ways stand)
        if (environ is None) if adopt is None else adopt:
            adopt_orphans(True)
        before = facts.before_script(facts.process_table(), root, by_group=by_group)
    except Exception as e:  # noqa: BLE001 - the script runs anyway; the report says why nothing was watched
        return ChildWatch(mark, root, by_group=by_group, error=f"{type(e).__name__}: {e}")
    return ChildWatch(mark, root, before, by_group)


def _ended_at_exit() -> set[int]:
    """The processes a library this process loaded ends itself at the interpreter's exit, after the
    report: Ray's driver shuts down the local cluster ray.init() started (ray.shutdown, registered
    with atexit: the GCS, the raylet and the workers it starts, the dashboard and monitors), as
    under `python script.py`. Never leftovers of the script; ending them here instead would run
    Ray's shutdown (or kill its processes) before the verdict is written. Read from Ray's node
    (a private attribute: another Ray version without it gives nothing, and its processes are
    then judged as any other)."""
    import sys
    ray = sys.modules.get("ray")
    if ray is None:
        return set()
    try:
        node = getattr(ray._private.worker, "_global_node", None)
        infos = getattr(node, "all_processes", None) or {}
        return {int(i.process.pid) for group in infos.values() for i in group
                if getattr(getattr(i, "process", None), "pid", None)}
    except Exception:  # noqa: BLE001 - a Ray whose internals moved: its processes are judged as any other
        return set()


def _python_exit(interpreter_exits: bool) -> set[int]:
    """Without the interpreter's exit, what multiprocessing's exit would do to its daemonic children
    (terminate them: DataLoader workers, a Pool's), done here; their pids are never leftovers."""
    import sys
    if interpreter_exits or "multiprocessing" not in sys.modules:
        return set()
    import multiprocessing
    out = set()
    for p in multiprocessing.active_children():
        if p.daemon and p.pid:
            p.terminate()
            out.add(p.pid)
    return out


def _alive(pid: int, started: float) -> bool:
    """Still the process that was found (same start time), and not a zombie."""
    p = facts.process(pid)
    return p is not None and p.started == started and not p.zombie


def _send(pid: int, started: float, sig: int) -> str | None:
    """Signal the process that was found; None when sent or gone, else why not."""
    if not _alive(pid, started):
        return None
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return None
    except PermissionError:
        return "not permitted"
    return None


def _wait_gone(procs: dict[int, float], bound: float) -> set[int]:
    """Wait (bounded) for the processes to end; the pids still alive."""
    deadline = time.monotonic() + bound
    while True:
        alive = {pid for pid, started in procs.items() if _alive(pid, started)}
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(POLL)


def _end(table: dict[int, facts.Proc], found: dict[int, str], grace: float) -> list[dict[str, Any]]:
    """Describe each process found (before touching it), SIGTERM them all, SIGKILL what outlives the
    grace; one record per process, saying how it ended."""
    from ddp_doctor.report.redact import redact_text
    from ddp_doctor.training.probes.exit_holders import started_at
    records: dict[int, dict[str, Any]] = {}
    for pid, how in found.items():
        cmd = facts.command_line(pid)
        records[pid] = {"pid": pid, "ppid": table[pid].ppid, "sid": table[pid].sid,
                        "cmdline": redact_text(cmd) if cmd else cmd,
                        "ports": facts.listening_ports(pid), "found_by": how, "ended": "exited"}
        site = started_at(pid)  # the script's line that started it (Popen, multiprocessing), when the probes saw it
        if site:
            records[pid]["started_at"] = site
    started = {pid: table[pid].started for pid in found}
    for pid in found:
        if _alive(pid, started[pid]):
            why = _send(pid, started[pid], signal.SIGTERM)
            records[pid]["ended"] = why or "SIGTERM"
    term = {pid: s for pid, s in started.items() if records[pid]["ended"] == "SIGTERM"}
    stubborn = _wait_gone(term, grace)
    for pid in stubborn:
        why = _send(pid, started[pid], signal.SIGKILL)
        records[pid]["ended"] = why or "SIGKILL"
    for pid in _wait_gone({pid: started[pid] for pid in stubborn}, KILL_WAIT):
        if records[pid]["ended"] == "SIGKILL":
            records[pid]["ended"] = "still running"
    return [records[pid] for pid in sorted(records)]
