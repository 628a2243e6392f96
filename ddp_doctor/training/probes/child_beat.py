"""The ranks a training script starts itself (torch.multiprocessing.spawn's children, Ray Train's
workers): their parent waits for them (in mp.spawn's join, in trainer.fit()) and sees none of
their progress. Each such process, once it is in a process group, writes a beat a second into
the run directory (`child-PID.json`, 0600: its rank, when it last made progress, whether its
training thread is inside a collective and where) and dumps every thread's stack into `child-stacks-PID.txt` on
SIGUSR2 (faulthandler: also while the main thread is blocked in a collective; where the script
holds SIGUSR2, or it could not be taken, the beat thread dumps them when the parent asks). The parent's
watchdog judges a hang from the beats and asks for the stacks (training/run/hung_children.py) and
the ledgers: the beat thread answers a ledger request as a launched rank's watchdog does (its
ledger-RANK.json, from torch's flight recorder), and a collective that raises leaves the
ledger at once (position "failed"): Ray Train keeps the exception in the worker and hands it to
the driver, no ending of this process follows.

Progress is a collective issued or an optimizer step, read from the process itself each second:
no collective is added, nothing the script sees changes. SIGUSR2 is taken only when the script
left it to its default.
"""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
from typing import Any

BEAT_FILE = "child-{}.json"
STACKS_FILE = "child-stacks-{}.txt"
STACK_SIGNAL = signal.SIGUSR2
INTERVAL = 1.0
_started = False


def beat_path(run_dir: str, pid: int) -> str:
    return os.path.join(run_dir, BEAT_FILE.format(pid))


def stacks_path(run_dir: str, pid: int) -> str:
    return os.path.join(run_dir, STACKS_FILE.format(pid))


def start(run_dir: str) -> None:
    """In a process the script started (install_in_child): the beat thread, once; it writes only
    while this process is in a process group."""
    global _started
    if _started:
        return
    _started = True
    from ddp_doctor.training.probes import collective_sites
    collective_sites.on_failure(lambda: _leave_ledger(run_dir, "failed", in_collective=True))
    threading.Thread(target=_beats, args=(run_dir,), name="ddp-doctor-child-beat", daemon=True).start()


def _leave_ledger(run_dir: str, position: str, *, in_collective: bool, where: str | None = None) -> None:
    """This rank's ledger-RANK.json, from torch's flight recorder (training/run/ledger.py)."""
    from ddp_doctor.training.run import ledger
    dist = sys.modules.get("torch.distributed")
    if dist is None or not ledger.default_group_is_up():
        return
    ledger.write(run_dir, dist.get_rank(), position, where=where, failed_in_collective=in_collective)


def _take_stack_signal(run_dir: str) -> bool:
    try:
        if signal.getsignal(STACK_SIGNAL) is not signal.SIG_DFL:
            return False  # the script's own
        stacks = open(stacks_path(run_dir, os.getpid()), "w", encoding="utf-8")  # noqa: SIM115 - kept open
        faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True)
        return True
    except (OSError, ValueError, RuntimeError):
        return False


def _beats(run_dir: str) -> None:
    from ddp_doctor.facts.frames import describe, stack_of
    from ddp_doctor.training import records
    from ddp_doctor.training.probes.recorder import collectives_issued, current_recorder, group_is_up
    from ddp_doctor.training.run.ledger import requested as ledger_requested
    main = threading.main_thread().ident or 0
    last: tuple[Any, Any] | None = None
    progress = answered = time.time()  # a ledger request older than this process is another job's
    begun = taken = False
    flushed: tuple[int, ...] = ()
    while True:
        time.sleep(INTERVAL)
        try:
            rec = current_recorder()
            up = group_is_up()
            if rec is not None and (up or begun) and (not begun or _recorded(rec) != flushed):
                # its record from the start (its rank, world, who started it: a hang or a stop before
                # its first step still has them), and again as it records more, also once its group
                # is gone (Ray Train destroys it after the train function): Ray ends its workers
                # without their exit, so the record written at a script's end never comes
                if not begun:
                    rec.adopt_group()
                begun, flushed = True, _recorded(rec)
                rec.flush(empty_too=True)
            if not up:
                continue
            dist = sys.modules["torch.distributed"]
            if not taken:  # tried again each beat until taken (never while the script holds the signal)
                taken = _take_stack_signal(run_dir)
            now, seen = time.time(), (collectives_issued(), getattr(rec, "steps", None))
            if seen != last:
                last, progress = seen, now
            where = describe(stack_of(_training_thread(main)))
            beat = {"pid": os.getpid(), "rank": dist.get_rank(), "world_size": dist.get_world_size(), "time": now,
                    "last_progress": progress, "steps": seen[1] or 0, "phase": "training", "stacks": taken, **where}
            records.write_json(beat_path(run_dir, os.getpid()), beat, redact=False)  # no free text
            if ledger_requested(run_dir, answered):
                answered = time.time()
                _leave_ledger(run_dir, "hung", in_collective=False, where=where["where"])
                if not taken:  # no SIGUSR2 of ours to ask with: every thread's stack from this thread
                    _dump_stacks(run_dir)
        except Exception:  # noqa: BLE001 - a beat never breaks the rank; the next second tries again
            continue


def _dump_stacks(run_dir: str) -> None:
    """Every thread's stack into this process's stacks file, as faulthandler writes it on SIGUSR2."""
    try:
        with open(stacks_path(run_dir, os.getpid()), "a", encoding="utf-8") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
    except (OSError, ValueError, RuntimeError):
        pass


def _recorded(rec: Any) -> tuple[int, ...]:
    """How much the recorder holds (steps, events, batches recorded, loaders): a change is worth a write."""
    return (rec.steps, len(rec.events), sum(len(v) for v in rec.iterations.values()), len(rec.loaders))


def _training_thread(main: int) -> int:
    """The thread that runs the training: the one inside a collective, else the one whose innermost
    frames are the user's code (Ray Train runs the train function on a thread of its own, its
    main thread serves the actor), else the main thread."""
    from ddp_doctor.facts.frames import describe, stack_of
    me = threading.get_ident()
    users = []
    for ident in sys._current_frames():
        if ident == me:
            continue
        where = describe(stack_of(ident))
        if where["in_collective"]:
            return ident
        if where["where"]:  # its innermost frame of the user's code (describe)
            users.append(ident)
    return main if main in users or not users else users[0]


def read_beats(run_dir: str, since: float) -> dict[int, dict[str, Any]]:
    """pid -> the newest beat of each process the script started that is still alive and wrote at
    `since` or later."""
    import glob

    from ddp_doctor.facts.process_table import process
    out: dict[int, dict[str, Any]] = {}
    for path in glob.glob(os.path.join(run_dir, BEAT_FILE.format("*"))):
        try:
            with open(path, encoding="utf-8") as f:
                beat = json.load(f)
            pid = int(beat["pid"])
            alive = process(pid)
            if float(beat.get("time", 0)) < since or alive is None or alive.zombie:
                continue
            out[pid] = beat
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out

