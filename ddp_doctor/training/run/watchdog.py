"""Progress watching inside a rank, without touching the user's collectives.

A daemon thread samples the main thread's Python stack once a second and counts optimizer steps
(a global step post-hook). Either changing is progress. Each sample is written to the rank's
heartbeat file, which the parent reads; SIGUSR2 makes faulthandler dump every thread's stack to the
rank's stack file, even while the main thread is blocked inside a collective. When the parent also
asks for ledgers (a ledger-request file), this thread dumps torch's flight recorder into the rank's
ledger: the main thread may be blocked inside a collective and cannot.

Under an outside launcher (no ddp-doctor parent), a rank that sees no progress for the hang
timeout ends itself after dumping its stacks, so the launcher ends the job; with progress lines
asked for (training/run/hang_lines.py), the node's lowest live rank says the stall before that.
"""
from __future__ import annotations

import faulthandler
import os
import select
import signal
import sys
import threading
import time
from collections import Counter, deque
from typing import Any, Callable

from ddp_doctor.facts import host_load
from ddp_doctor.facts.frames import describe, stack_of
from ddp_doctor.facts.launchers import multi_node, world_sizes
from ddp_doctor.report.private_files import keep_dir, let_go
from ddp_doctor.training import records
from ddp_doctor.training.run import endings, ledger

STACK_SIGNAL = signal.SIGUSR2
STEP_TIMES = 200  # the latest optimizer steps' end times kept for the heartbeat (the trace's steps)
SAMPLE_PLACES = 50  # distinct places counted by the stack samples (later new places: in the total only)


# What a stack shows the main thread doing, by the outermost torch frame that says it (a forward
# recomputed inside a backward, as activation checkpointing does, is the backward's).
ACTIVITIES = (
    ("backward", (os.path.join("torch", "autograd", ""), os.path.join("torch", "_tensor.py"))),
    ("forward", (os.path.join("torch", "nn", "modules", "module.py"),)),
    ("data", (os.path.join("torch", "utils", "data", ""),)),
    ("optimizer", (os.path.join("torch", "optim", ""),)),
)


def activity(stack: list[tuple[str, int, str]]) -> str:
    """"backward", "forward", "data", "optimizer", or "script" (the script's own code, or
    libraries other than those torch parts)."""
    for file, _, func in stack:
        for name, parts in ACTIVITIES:
            if any(p in file for p in parts) and (name != "backward" or "backward" in func or "autograd" in file):
                return name
    return "script"


def _stack_text(thread_id: int) -> str:
    """A thread's stack as Python prints a traceback (for another node's report)."""
    import traceback
    frame = sys._current_frames().get(thread_id)
    return "".join(traceback.format_stack(frame)) if frame is not None else ""


# Where a process waits for the ranks it started: torch.multiprocessing.spawn's join, and Ray
# Train's trainer.fit() in the driver (its workers are Ray actors on the cluster)
RANKS_STARTED_HERE = (os.path.join("torch", "multiprocessing", "spawn.py"),
                      os.path.join("ray", "train", "v2", "api", "data_parallel_trainer.py"),
                      os.path.join("ray", "train", "base_trainer.py"))


def _waiting_for_spawned_ranks(stack: list[tuple[str, int, str]]) -> bool:
    return any(f[0].endswith(RANKS_STARTED_HERE) for f in stack)


_arrived: list[int] = []  # stop signals whose Python-level handler ran (in the main thread)


def _note_stop(signum: int, frame: Any) -> None:
    """The Python-level handler for stop signals under an outside launcher: the watchdog thread
    acts on them. It hears of a signal through the wakeup pipe (at once, even while the main thread
    is blocked in a collective) or through this note, when the pipe is no longer ours (asyncio
    takes the wakeup fd for its loop and gives it back as -1): never a signal that ends nothing."""
    _arrived.append(int(signum))


_WATCHED: dict[str, Any] = {}  # this process's stop watch (its wakeup pipe, the signals it handles)


def _forget_stop_watch() -> None:
    """In a process the script forked: the rank's stop watch is not its own. Its handler would
    write a stop into the pipe the rank shares with it (the rank would take a leftover's SIGTERM
    for its own and exit 143), so the child gets its signals' default actions and no wakeup pipe."""
    if not _WATCHED:
        return
    import signal as signals
    try:
        signals.set_wakeup_fd(-1)
        for sig in _WATCHED.get("signals") or ():
            if signals.getsignal(sig) is _note_stop:
                signals.signal(sig, signals.SIG_DFL)
        for fd in _WATCHED.get("pipe") or ():
            os.close(fd)
    except (OSError, ValueError):
        pass
    _WATCHED.clear()
    del _arrived[:]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_stop_watch)


class ProgressWatch:
    def __init__(self, run_dir: str, rank: int, hang_timeout: float | None, *,
                 on_hang: Callable[["ProgressWatch"], None] | None = None, interval: float = 1.0) -> None:
        from ddp_doctor.training.run.hang_bound import HangBound
        self.run_dir, self.rank = run_dir, rank
        self.hang_bound = HangBound(hang_timeout)
        self.hang_timeout = hang_timeout or 0.0  # the bound that fired, once it has
        self.in_collective = False
        self.on_stop: Callable[["ProgressWatch", int], None] | None = None
        # one process, no launcher: the ranks its script started hung (training/run/hung_children.py)
        self.on_children_hang: Callable[["ProgressWatch", Any], None] | None = None
        self.stopping = False  # a stop signal is being reported (the process ends right after)
        self._claim = threading.Lock()
        self._wake_fd: int | None = None
        self._stop_seen: int | None = None  # a stop signal read from the pipe while waiting
        # a stop signal (SIGTERM, SIGHUP) whose handler was the script's own (Ray's driver installs
        # one that exits 1): the script's to act on, and what ended it if it then failed
        self.stop_to_script: int | None = None
        self._ours: set[int] = set()
        self.on_hang, self.interval = on_hang, interval
        self.progress: Any = None  # outside launcher, --progress: training/run/hang_lines.HangLines
        self.steps = 0
        self.step_times: deque[float] = deque(maxlen=STEP_TIMES)
        self.slowest_step = 0.0  # seconds between two optimizer steps, at most (the hang bound's unit)
        self.last_progress = time.time()
        self.job_since = self.last_progress - records.SAME_JOB  # older records are another job's
        self.children: Any = None  # the script's processes (training/run/child_watch.ChildWatch), once it runs
        self.phase = "preflight"
        self.where: str | None = None  # innermost user frame of the last sample
        # where the main thread was, sample by sample, while training outside a collective: where a
        # rank that arrives last at the collectives spends its time (bounded: SAMPLE_PLACES places)
        self.samples: Counter[str] = Counter()
        self.doing: Counter[str] = Counter()  # the same samples by activity (activity())
        self.samples_total = 0
        self.script_started_ns = 0  # the ledger keeps the collectives from here on
        self.load_since: host_load.CpuTimes | None = None
        self._ledger_done = False
        self._ledger_for_remote = False  # written for another node's hang, not yet for this one's
        self._main = threading.main_thread().ident or 0
        self._stop = threading.Event()
        self._stack_file: Any = None
        # several nodes: a hang found on one node reaches the others through the job's store
        self._across = endings.HangExchange(run_dir, rank) if multi_node(*world_sizes(os.environ)) else None

    def start(self) -> "ProgressWatch":
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
            register_optimizer_step_post_hook(self._on_step)
        except Exception:  # noqa: BLE001 - older torch: stack sampling alone still tells progress
            pass
        keep_dir(self.run_dir)  # removed while the job runs (the script, a /tmp cleaner): made again
        self.open_stack_file()
        threading.Thread(target=self._loop, name="ddp-doctor-watchdog", daemon=True).start()
        return self

    def open_stack_file(self) -> None:
        """faulthandler writes every thread's stack to stack-RANK.txt on STACK_SIGNAL (opened by
        start(), again by the watchdog thread when the run directory was removed)."""
        try:
            self._stack_file = records.open_private(records.stack_path(self.run_dir, self.rank))
            if threading.current_thread() is threading.main_thread():
                # faulthandler puts back the handler it found when the interpreter exits: "ignore",
                # so a peer's request for stacks that lands then never ends the process (SIGUSR2's
                # default) and its exit status stays its own
                signal.signal(STACK_SIGNAL, signal.SIG_IGN)
            faulthandler.register(STACK_SIGNAL, file=self._stack_file, all_threads=True, chain=False)
        except (OSError, ValueError, RuntimeError):
            self._stack_file = None

    def _stack_file_gone(self) -> bool:
        """The run directory was removed (and made again by a record's write): faulthandler still
        writes into the removed file, where the parent cannot read it."""
        return self._stack_file is not None and not os.path.exists(records.stack_path(self.run_dir, self.rank))

    def stop(self) -> None:
        self._stop.set()
        let_go(self.run_dir)  # its owner may remove it now

    def _on_step(self, *_: Any) -> None:
        now = time.time()
        if self.step_times:
            self.slowest_step = max(self.slowest_step, now - self.step_times[-1])
        self.steps += 1
        self.step_times.append(now)

    def _loop(self) -> None:
        last_sig: Any = None
        last_steps = -1
        fired = False
        while not self.tick():
            phase = self.phase
            stack = stack_of(self._main)
            sig = tuple(stack)
            now = time.time()
            if sig != last_sig or self.steps != last_steps:
                self.last_progress = now
                last_sig, last_steps = sig, self.steps
            where = describe(stack)
            self.where, self.in_collective = where["where"], where["in_collective"]
            if self.phase == "training" and self.steps and not self.in_collective:
                # from the first optimizer step on: start-up (imports, the group, DDP's own
                # broadcast, which no torch.distributed frame shows) is not the training's pace
                self.sample(where["where"] or where["innermost"] or "?", activity(stack))
            if phase == self.phase:  # a stack taken before the phase changed is not where it is now
                self.beat(now, where)
            if self._stack_file is None or self._stack_file_gone():
                # removed (or not made: the directory was gone a moment before this tick's
                # heartbeat made it again): opened again, tick after tick until it is there
                old, self._stack_file = self._stack_file, None
                self.open_stack_file()
                try:
                    if old is not None:
                        old.close()
                except OSError:
                    pass
            waiting = self.phase == "training" and _waiting_for_spawned_ranks(stack)
            if waiting and not ledger.default_group_is_up():
                pass  # no group of its own: the ranks it started answer for themselves (child_beat.py)
            elif self.phase == "training" and (not self._ledger_done or self._ledger_for_remote) \
                    and ledger.requested(self.run_dir, self.job_since):
                # once: the job ends right after (a hang, or a peer that failed)
                hang = ledger.request_reason(self.run_dir) == "hang"
                # a peer failed: a collective this rank is inside will not complete, even if the
                # peer's exit makes it fail (torch then retires it) before this dump
                self.write_ledger("hung" if hang else "running", failed_in_collective=not hang and self.in_collective)
                if hang and self._across is not None and not self._across.done:
                    self._across.share(self.where, _stack_text(self._main))  # tell the other nodes
            elif (self.phase == "training" and self._across is not None and not self._across.done
                  and now - self.last_progress >= endings.HANG_LOOK_AFTER and self._across.asked(now)):
                # another node found the job hung while this rank made no progress either
                self.write_ledger("hung")
                self._ledger_for_remote = True  # this node's parent, when it asks, gets it again
                self._across.share(self.where, _stack_text(self._main))
            if self.phase != "training" or waiting:
                # preflight and teardown have bounds of their own; a process joining the ranks it
                # spawned is idle by design while they train (their progress is their beats')
                self.last_progress = now
                if waiting and self.on_children_hang is not None and not fired:
                    from ddp_doctor.training.run.hung_children import children_hung
                    found = children_hung(self, now)
                    if found is not None:
                        fired = True
                        self.on_children_hang(self, found)
            elif self.on_hang and not fired and self._hung(now):
                fired = True
                self.on_hang(self)
            elif self.progress is not None and not fired:
                self._say_progress(now)
            stop = self.stop_signal()
            if stop is not None and self.on_stop is not None:
                self.on_stop(self, stop)

    def sample(self, place: str, doing: str = "script") -> None:
        """Count one sample of where the main thread is (`place`) and what it does (activity())."""
        self.samples_total += 1
        self.doing[doing] += 1
        if place in self.samples or len(self.samples) < SAMPLE_PLACES:
            self.samples[place] += 1

    def beat(self, now: float, where: dict[str, Any]) -> None:
        """Write the rank's heartbeat: its progress, and `where` (describe()) the main thread is."""
        records.write_heartbeat(self.run_dir, self.rank, {
            "time": now, "last_progress": self.last_progress, "steps": self.steps,
            "step_times": list(self.step_times), "slowest_step": self.slowest_step, "phase": self.phase,
            **where})

    def training_starts(self) -> None:
        """The script is about to run: a heartbeat at once (a rank killed in its first second
        must still be known to have trained, with its pid)."""
        self.load_since = host_load.read_cpu_times()  # how busy the host was while it trained
        self.phase = "training"
        self.last_progress = time.time()
        self.beat(self.last_progress, {"where": None, "innermost": None, "in_collective": False})

    def claim_stop(self) -> bool:
        """Whether the calling thread reports the stop: once per process. One signal reaches both
        the pipe and the handler's note, so the main thread and this one may each read it."""
        with self._claim:
            if self.stopping:
                return False
            self.stopping = True
            return True

    def tick(self) -> bool:
        """Wait one interval, less when a stop signal arrives on the wakeup pipe (every rank of a
        stopped job then acts at once, before a peer's exit makes its collective fail); other
        signals a script handles (a profiler's timer) do not shorten it. True once stopped."""
        if self._wake_fd is None:
            return self._stop.wait(self.interval)
        deadline = time.monotonic() + self.interval
        while (left := deadline - time.monotonic()) > 0 and self._stop_seen is None:
            try:
                ready, _, _ = select.select([self._wake_fd], [], [], left)
            except (OSError, ValueError):  # the pipe was closed under us: the plain interval
                return self._stop.wait(left)
            if ready:
                self._stop_seen = self._read_stop()
        return self._stop.is_set()

    def watch_stop_signals(self, on_stop: Callable[["ProgressWatch", int], None]) -> None:
        """Under an outside launcher (torchrun, SageMaker's toolkit), SIGTERM and SIGHUP end the
        rank: torchrun forwards them when a job is stopped. Called from the main thread: a no-op
        handler makes Python write each such signal to a pipe at once (set_wakeup_fd), even while
        the main thread is blocked in a collective, and this thread calls `on_stop` with it. Only
        for signals the script leaves to their default (a script's own handler stays in charge)."""
        import signal as signals
        try:
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            signals.set_wakeup_fd(w)
        except (OSError, ValueError):  # not the main thread, or no pipes: the default stays
            return
        self._wake_fd, self.on_stop = r, on_stop
        for sig in (signals.SIGTERM, signals.SIGHUP):
            if signals.getsignal(sig) is signals.SIG_DFL:
                signals.signal(sig, _note_stop)
                self._ours.add(int(sig))
        _WATCHED.update({"pipe": (r, w), "signals": set(self._ours)})

    def stop_signal(self) -> int | None:
        """A stop signal that arrived since the last look, if its handler is still ours; each
        signal is handed out once, to whichever thread looks first."""
        with self._claim:
            seen, self._stop_seen = self._stop_seen, None
        return seen if seen is not None else self._read_stop()

    def _read_stop(self) -> int | None:
        import signal as signals
        if self._wake_fd is None:
            return None
        try:
            data = list(os.read(self._wake_fd, 64))
        except (BlockingIOError, OSError):
            data = []
        while _arrived:
            data.append(_arrived.pop(0))
        for b in data:
            if b in self._ours and signals.getsignal(b) is _note_stop:
                return int(b)
            if b in (signals.SIGTERM, signals.SIGHUP) and self.stop_to_script is None:
                self.stop_to_script = int(b)
        return None

    def _hung(self, now: float) -> bool:
        """Outside launcher: this rank judges from its own node's heartbeats (a peer of this node
        still working is a slow rank, not a hang)."""
        from ddp_doctor.training.run.hang_bound import judge
        hbs = {r: hb for r, hb in records.read_heartbeats(self.run_dir, self.job_since).items()
               if hb.get("phase") == "training"}
        hbs[self.rank] = {"last_progress": self.last_progress, "steps": self.steps,
                          "slowest_step": self.slowest_step, "in_collective": self.in_collective}
        verdict = judge(hbs, now, self.hang_bound)
        if verdict is None or not verdict.hung or self.rank not in verdict.stalled:
            return False
        self.hang_timeout = verdict.bound
        return True

    def _node_beats(self) -> dict[int, dict[str, Any]]:
        """This node's training ranks that have not ended, this rank as it is now."""
        from ddp_doctor.training.run.hang_lines import training_beats
        hbs = training_beats(self.run_dir, self.job_since)
        hbs[self.rank] = {**hbs.get(self.rank, {}), "last_progress": self.last_progress, "steps": self.steps,
                          "slowest_step": self.slowest_step, "in_collective": self.in_collective,
                          "where": self.where, "time": time.time()}
        return hbs

    def _say_progress(self, now: float) -> None:
        """Outside launcher: one progress line per node, said by the node's lowest live rank (the
        stuck one included: this thread runs while its main thread is blocked). Every rank follows
        the rule, so a rank that takes over says no step twice."""
        from ddp_doctor.processes.progress import say
        hbs = self._node_beats()
        line = self.progress.due(hbs, now)
        live = [r for r, hb in hbs.items() if now - float(hb.get("time") or 0) <= 5 * self.interval + 1]
        if line and min(live, default=self.rank) == self.rank:
            say(line)

    def write_ledger(self, position: str, *, where: str | None = None, failed_in_collective: bool = False) -> bool:
        self._ledger_done, self._ledger_for_remote = True, False
        samples = {"total": self.samples_total, "where": dict(self.samples.most_common(10)),
                   "doing": dict(self.doing), "interval_s": self.interval} if self.samples_total else None
        load = host_load.window(self.load_since).to_dict() if self.load_since is not None else None
        return ledger.write(self.run_dir, self.rank, position, since_ns=self.script_started_ns,
                            steps=self.steps, where=(where or None) if where is not None else self.where,
                            failed_in_collective=failed_in_collective, samples=samples, host_load=load)

    def save_stacks(self, text: str | None = None) -> None:
        """Every thread's stack, or `text` (a traceback), into the rank's stack file, where the
        report reads it; nothing when that file could not be opened."""
        if self._stack_file is None:
            return
        if text is None:
            self.dump_stacks(self._stack_file)
        else:
            self._stack_file.write(text)
            self._stack_file.flush()

    def dump_stacks(self, stream: Any) -> None:
        """Every thread's stack to `stream`; a closed or broken stream (stderr closed by the
        shell, a reader gone) takes nothing and raises nothing."""
        try:
            faulthandler.dump_traceback(file=stream, all_threads=True)
        except (OSError, ValueError, AttributeError, RuntimeError):
            pass


LEDGER_WAIT = 5.0  # seconds the asker waits for the ranks' ledgers on a hang (watchdogs poll each second)


def collect_stacks(run_dir: str, hbs: dict[int, dict[str, Any]], reason: str = "hang", *,
                   across: bool = False) -> dict[int, dict[str, Any]]:
    """Ask every rank for its stacks (SIGUSR2 -> faulthandler) and its ledger of collectives (a
    request file its watchdog thread polls), give them a bounded moment to write. `across`:
    several nodes; at a hang the ranks also fetch the other nodes' (training/run/endings.py)."""
    asked = time.time()
    ledger.request(run_dir, reason=reason)
    for hb in hbs.values():
        try:
            os.kill(int(hb["pid"]), STACK_SIGNAL)
        except (OSError, KeyError, ValueError):
            pass
    time.sleep(1.0)
    ended = records.read_outcomes(run_dir)  # a rank whose script ended wrote its ledger then
    live = [r for r in hbs if r not in ended]
    ledger.wait_for(run_dir, live, asked, LEDGER_WAIT)
    if across and reason == "hang":
        endings.wait_shared(run_dir, live, asked, endings.HANG_SHARE_WAIT + 3.0)
    return hbs
