"""Progress watching inside a rank, without touching the user's collectives.

A daemon thread samples the main thread's Python stack once a second and counts optimizer steps
(a global step post-hook). Either changing is progress. Each sample is written to the rank's
heartbeat file, which the parent reads; SIGUSR2 makes faulthandler dump every thread's stack to the
rank's stack file, even while the main thread is blocked inside a collective.

Under an outside launcher (no ddp-doctor parent), a rank that sees no progress for the hang
timeout ends itself after dumping its stacks, so the launcher ends the job.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

from ddp_doctor.training import records
from ddp_doctor.training.frames import not_user_code_dirs

STACK_SIGNAL = signal.SIGUSR2
COLLECTIVE_FILES = ("distributed_c10d.py", "c10d_logger.py")


def stack_of(thread_id: int) -> list[tuple[str, int, str]]:
    """(file, line, function) of a thread's frames, outermost first."""
    frame = sys._current_frames().get(thread_id)
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return out[::-1]


def _waiting_for_spawned_ranks(stack: list[tuple[str, int, str]]) -> bool:
    return any(f[0].endswith(os.path.join("torch", "multiprocessing", "spawn.py")) for f in stack)


def describe(stack: list[tuple[str, int, str]]) -> dict[str, Any]:
    """Where a stack is: the innermost frame of user code, and whether it sits in a collective."""
    skip = not_user_code_dirs()
    user = next((f for f in reversed(stack) if not f[0].startswith(skip)), None)
    inner = stack[-1] if stack else None
    return {
        "where": f"{user[0]}:{user[1]} in {user[2]}" if user else None,
        "innermost": f"{inner[0]}:{inner[1]} in {inner[2]}" if inner else None,
        "in_collective": any(os.path.basename(f[0]) in COLLECTIVE_FILES for f in stack),
    }


class ProgressWatch:
    def __init__(self, run_dir: str, rank: int, hang_timeout: float, *,
                 on_hang: Callable[["ProgressWatch"], None] | None = None, interval: float = 1.0) -> None:
        self.run_dir, self.rank, self.hang_timeout = run_dir, rank, hang_timeout
        self.on_hang, self.interval = on_hang, interval
        self.steps = 0
        self.last_progress = time.time()
        self.phase = "preflight"
        self._main = threading.main_thread().ident or 0
        self._stop = threading.Event()
        self._stack_file: Any = None

    def start(self) -> "ProgressWatch":
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
            register_optimizer_step_post_hook(self._on_step)
        except Exception:  # noqa: BLE001 - older torch: stack sampling alone still tells progress
            pass
        try:
            self._stack_file = open(records.stack_path(self.run_dir, self.rank), "w", encoding="utf-8")
            faulthandler.register(STACK_SIGNAL, file=self._stack_file, all_threads=True, chain=False)
        except (OSError, ValueError, RuntimeError):
            self._stack_file = None
        threading.Thread(target=self._loop, name="ddp-doctor-watchdog", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _on_step(self, *_: Any) -> None:
        self.steps += 1

    def _loop(self) -> None:
        last_sig: Any = None
        last_steps = -1
        fired = False
        while not self._stop.wait(self.interval):
            stack = stack_of(self._main)
            sig = tuple(stack)
            now = time.time()
            if sig != last_sig or self.steps != last_steps:
                self.last_progress = now
                last_sig, last_steps = sig, self.steps
            records.write_heartbeat(self.run_dir, self.rank, {
                "time": now, "last_progress": self.last_progress, "steps": self.steps,
                "phase": self.phase, **describe(stack)})
            if self.phase != "training" or _waiting_for_spawned_ranks(stack):
                # preflight and teardown have bounds of their own; a process joining the ranks it
                # spawned is idle by design while they train (their own progress is not seen here)
                self.last_progress = now
            elif self.on_hang and not fired and now - self.last_progress > self.hang_timeout:
                fired = True
                self.on_hang(self)

    def dump_stacks(self, stream: Any) -> None:
        faulthandler.dump_traceback(file=stream, all_threads=True)
