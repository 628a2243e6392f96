"""The hang bound of `ddp-doctor run` (training/run/hang_bound.py), on heartbeat dicts."""
from __future__ import annotations

from ddp_doctor.training.run.hang_bound import (
    BEFORE_STEPS,
    FLOOR,
    SLOW_RANK_LIMIT,
    STEP_MULTIPLE,
    HangBound,
    judge,
)

NOW = 10_000.0


def hb(idle: float, *, steps: int = 100, slowest: float = 0.5, in_collective: bool = True) -> dict:
    return {"last_progress": NOW - idle, "steps": steps, "slowest_step": slowest, "in_collective": in_collective}


def test_a_fixed_bound_applies_to_every_rank_whatever_it_does():
    bound = HangBound(20.0)
    assert judge({0: hb(19), 1: hb(5)}, NOW, bound) is None
    v = judge({0: hb(21), 1: hb(1)}, NOW, bound)  # even with a peer still working
    assert v.hung and v.stalled == [0] and v.bound == 20.0


def test_before_the_first_steps_the_bound_is_long():
    bound = HangBound()
    assert bound.for_rank(hb(0, steps=0)) == BEFORE_STEPS
    assert judge({0: hb(BEFORE_STEPS - 1, steps=1), 1: hb(BEFORE_STEPS - 1, steps=1)}, NOW, bound) is None
    v = judge({0: hb(BEFORE_STEPS + 1, steps=1), 1: hb(BEFORE_STEPS + 1, steps=1)}, NOW, bound)
    assert v.hung and v.bound == BEFORE_STEPS


def test_after_the_first_steps_it_follows_the_slowest_step_with_a_floor():
    bound = HangBound()
    assert bound.for_rank(hb(0, slowest=0.2)) == FLOOR  # fast steps: the floor
    assert bound.for_rank(hb(0, slowest=60.0)) == STEP_MULTIPLE * 60.0  # slow steps: a multiple
    everyone_stuck = {0: hb(FLOOR + 1), 1: hb(FLOOR + 1)}
    v = judge(everyone_stuck, NOW, bound)
    assert v.hung and v.stalled == [0, 1] and v.bound == FLOOR
    # the same idle time is fine for a job whose slowest step took a minute
    assert judge({0: hb(FLOOR + 1, slowest=60), 1: hb(FLOOR + 1, slowest=60)}, NOW, bound) is None


def test_ranks_waiting_for_a_rank_that_still_works_are_a_slow_rank_until_torchs_timeout():
    bound = HangBound()
    waiting = {0: hb(1, in_collective=False), 1: hb(FLOOR + 60)}  # rank 0 checkpoints, rank 1 at a barrier
    v = judge(waiting, NOW, bound)
    assert v is not None and not v.hung and v.stalled == [1] and v.moving == [0]
    v = judge({0: hb(1, in_collective=False), 1: hb(SLOW_RANK_LIMIT + 1)}, NOW, bound)
    assert v.hung and v.bound == SLOW_RANK_LIMIT


def test_a_stalled_rank_outside_a_collective_is_a_hang_even_when_others_move():
    # rank 1 is stuck in its own code (a deadlocked data loader), not waiting for anyone
    v = judge({0: hb(1), 1: hb(FLOOR + 1, in_collective=False)}, NOW, HangBound())
    assert v.hung and v.stalled == [1]


def test_a_slow_rank_episode_becomes_one_warning_naming_who_waited_and_where():
    from ddp_doctor.checks.stalls import slow_rank_finding
    f = slow_rank_finding({"waited": 412.0, "waiting": [1, 2, 3], "working": [0],
                           "where": {"0": "train.py:88 in save_checkpoint"}})
    assert f.id == "DDP809" and f.severity == "warning" and f.ranks == [0]
    assert f.message == ("rank 0 kept ranks 1-3 waiting in a collective for 412 s "
                         "(rank 0 at train.py:88 in save_checkpoint)")


def test_the_parent_notes_the_longest_slow_rank_wait_and_stops_only_a_hang(tmp_path):
    import time

    from ddp_doctor.training import records
    from ddp_doctor.training.run.stall_watch import detect_hang
    now = time.time()
    d = str(tmp_path)
    base = {"phase": "training", "steps": 50, "slowest_step": 0.5}
    records.write_heartbeat(d, 0, {**base, "last_progress": now - 1, "in_collective": False,
                                   "where": "train.py:88 in save_checkpoint"})
    records.write_heartbeat(d, 1, {**base, "last_progress": now - FLOOR - 20, "in_collective": True,
                                   "where": "train.py:90 in <module>"})
    slow: dict = {}
    assert detect_hang(d, None, slow) is None  # a slow rank, not a hang
    assert slow["waiting"] == [1] and slow["working"] == [0] and slow["waited"] >= FLOOR
    assert slow["where"] == {"0": "train.py:88 in save_checkpoint"}
    hung = detect_hang(d, 10.0, slow)  # a fixed bound stops it
    assert hung is not None and hung[1]["bound"] == 10.0


def test_a_stop_signal_reaches_the_watchdog_even_when_the_wakeup_pipe_was_taken(tmp_path):
    """asyncio takes the wakeup fd for its loop (and sets it to -1 on close): the handler's own note
    still tells the watchdog, so SIGTERM never ends up doing nothing."""
    import os
    import signal

    from ddp_doctor.training.run.watchdog import ProgressWatch
    old_term, old_hup = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    watch = ProgressWatch(str(tmp_path), 0, None)
    try:
        watch.watch_stop_signals(lambda w, sig: None)
        signal.set_wakeup_fd(-1)  # what asyncio's loop.close() leaves behind
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in this (main) thread
        assert watch.stop_signal() == signal.SIGTERM
        assert watch.stop_signal() is None  # once
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGHUP, old_hup)
        signal.set_wakeup_fd(-1)


def test_a_stop_the_scripts_own_handler_takes_is_noted_not_acted_on(tmp_path):
    """Ray's driver installs its own SIGTERM handler (sys.exit): the stop is the script's to act on,
    and the watchdog notes it, so a script that then fails is reported as stopped by it."""
    import os
    import signal

    from ddp_doctor.training.run.watchdog import ProgressWatch
    old_term, old_hup = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    watch = ProgressWatch(str(tmp_path), 0, None)
    taken: list[int] = []
    try:
        watch.watch_stop_signals(lambda w, sig: None)
        signal.signal(signal.SIGTERM, lambda signum, frame: taken.append(signum))  # the script's own
        os.kill(os.getpid(), signal.SIGTERM)
        assert taken == [signal.SIGTERM]
        assert watch.stop_signal() is None and watch.stop_to_script == signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGHUP, old_hup)
        signal.set_wakeup_fd(-1)


def test_the_watchdog_wakes_at_once_for_a_stop_signal_and_not_for_a_scripts_other_signals(tmp_path, monkeypatch):
    """Every rank of a stopped job acts at once (not at its next tick); a signal the script handles
    itself (a profiler's timer) writes to the same pipe and must not shorten the interval."""
    import os
    import select
    import signal
    from types import SimpleNamespace

    from ddp_doctor.training.run import watchdog
    from ddp_doctor.training.run.watchdog import ProgressWatch
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGUSR1, lambda *_: None)  # the script's own handler
    waits: list[bool] = []  # each wait of the tick on the wakeup pipe: did it end with a byte to read

    def recorded(r, w, x, timeout):
        got = select.select(r, w, x, timeout)
        waits.append(bool(got[0]))
        return got

    monkeypatch.setattr(watchdog, "select", SimpleNamespace(select=recorded))
    watch = ProgressWatch(str(tmp_path), 0, None, interval=0.3)
    try:
        watch.watch_stop_signals(lambda w, sig: None)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert watch.tick() is False and watch.stop_signal() is None
        # the script's signal woke the wait, which went on until the interval ran out (a wait that
        # ends with nothing to read is one that reached its timeout): the whole interval
        assert waits[0] is True and waits[-1] is False, waits
        waits.clear()
        watch.interval = 60.0
        os.kill(os.getpid(), signal.SIGTERM)
        assert watch.tick() is False and watch.stop_signal() == signal.SIGTERM
        assert waits == [True]  # at once: one wait, ended by the signal, not by the 60 s interval
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(-1)


def test_a_stop_is_reported_by_one_thread_only(tmp_path):
    """One SIGTERM reaches the pipe and the handler's note: the main thread (its script just ended)
    and the watchdog may both read one; only the first to claim reports it."""
    from concurrent.futures import ThreadPoolExecutor

    from ddp_doctor.training.run.watchdog import ProgressWatch
    watch = ProgressWatch(str(tmp_path), 0, None)
    with ThreadPoolExecutor(max_workers=8) as pool:
        claims = list(pool.map(lambda _: watch.claim_stop(), range(64)))
    assert claims.count(True) == 1 and watch.stopping
