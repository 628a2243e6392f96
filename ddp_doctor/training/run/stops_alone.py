"""The stops of `ddp-doctor run script.py` run as one process, without a launcher: SIGTERM, SIGHUP
or SIGINT end in an "interrupted" report with where the script was, once, then the exit status
128 + the signal (StopsAlone).
"""
from __future__ import annotations

import os
import runpy
import shutil
import signal
import sys
import threading
import time
from typing import Any

from ddp_doctor.facts.frames import describe, stack_of
from ddp_doctor.processes.stop_signals import Interrupt
from ddp_doctor.processes.tree import end_descendants
from ddp_doctor.training import records
from ddp_doctor.training.run import target as target_module
from ddp_doctor.training.run.options import RunOptions
from ddp_doctor.training.run.outside_report import write_outside_report
from ddp_doctor.training.run.stopped_rank import say, wait_for_stop


class StopsAlone:
    """One process, no launcher (`ddp-doctor run script.py`): SIGTERM, SIGHUP or SIGINT end in an
    "interrupted" report with where it was (its stack), once, then the exit status 128 + the signal.
    The watchdog thread takes SIGTERM and SIGHUP (also while the main thread is blocked). SIGINT is
    the script's KeyboardInterrupt while the script runs, as under `python SCRIPT` (its own except
    and finally blocks run), and the report follows it; outside the script (the preflight, the end)
    it is reported at once. The processes the script started (spawned ranks) are ended with it. A
    stop that comes after the script ended on its own is noted on stderr, and the exit status is then
    128 + its number; the report is the run's own. A script's own handler stays in charge."""

    def __init__(self, watch: Any, started: float, opts: RunOptions) -> None:
        self.watch, self.started, self.opts = watch, started, opts
        self.sigint_at: float | None = None  # a SIGINT raised KeyboardInterrupt in the script
        self.sigint_where: dict[str, Any] | None = None  # where the script was then (watchdog.describe)
        self.late: list[int] = []
        watch.watch_stop_signals(lambda w, signo: self.end(signo))
        try:
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not ignored (nohup, `&`)
                signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread
            pass

    def _on_sigint(self, signum: int, frame: Any) -> None:
        """Python-level, on the main thread: inside the script, its KeyboardInterrupt; elsewhere
        (ddp-doctor's own code around it) the stop is reported from here."""
        if _in_script(frame):
            self.sigint_at = time.time()
            chain = []
            while frame is not None:
                chain.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
                frame = frame.f_back
            self.sigint_where = describe(chain[::-1])
            raise KeyboardInterrupt
        self.end(signum, on_main=True)

    def after_script(self, signo: int | None, outcome: Any) -> None:
        """Main thread: a stop signal read as the script ended, or the KeyboardInterrupt of a SIGINT
        that ended it, is reported now (the process then ends)."""
        stopped_by_sigint = (self.sigint_at is not None
                             and (outcome.exception or {}).get("type") == "KeyboardInterrupt")
        if signo is None and stopped_by_sigint:
            signo = int(signal.SIGINT)
        if signo is not None:
            self.end(signo, traceback=(outcome.exception or {}).get("traceback") if stopped_by_sigint else None,
                     on_main=True)

    def claim(self) -> None:
        """Main thread, the script ended on its own: its ending is the report. A stop the watchdog
        thread is reporting already ends the process."""
        if not self.watch.claim_stop():
            wait_for_stop()

    def end(self, signo: int, traceback: str | None = None, on_main: bool = False) -> None:
        """Report the stop and end the process (os._exit), once; a stop while another ending is
        being reported is noted. `traceback`: the script's KeyboardInterrupt (where it was);
        `on_main`: called by the main thread once the script ended (its last sample says where)."""
        w = self.watch
        if not w.claim_stop():
            self.late.append(signo)
            return
        stop = Interrupt(signo)
        try:
            say(f"ddp-doctor: stopped by {stop.name}; where it was follows\n")
            if not on_main:  # the watchdog thread: where the main thread is now
                w.beat(time.time(), describe(stack_of(threading.main_thread().ident or 0)))
            elif traceback is not None and self.sigint_where:  # where the KeyboardInterrupt hit the script
                w.stop()  # no later sample (this thread, in ddp-doctor's code now) replaces it
                w.beat(time.time(), self.sigint_where)
            if traceback is None:
                w.dump_stacks(sys.stderr)
            w.save_stacks(traceback)
            records.write_outcome(w.run_dir, w.rank, {
                "exit_code": stop.exit_code, "exception": None, "interrupted": stop.to_dict(),
                "host": os.uname().nodename, "phase": w.phase})
            # the report before the script's processes are ended: a library that loses its own
            # processes may abort this one (Ray's driver does when its raylet and GCS go)
            write_outside_report(w.rank, w.run_dir, self.started, True, self.opts, interrupted=stop)
            ended = len(end_descendants())
            if ended:
                say(f"ddp-doctor: ended {ended} process(es) the script had started\n")
            self.late += [s for s in [w.stop_signal()] if s is not None]
            self._note_late("while the stop was reported; the report is the first stop's")
        except Exception as e:  # noqa: BLE001 - the process still ends as the signal asks
            say(f"ddp-doctor: the stop could not be reported whole ({type(e).__name__}: {e})\n")
        finally:
            shutil.rmtree(w.run_dir, ignore_errors=True)
            _flush()
            os._exit(stop.exit_code)

    def _note_late(self, what: str) -> None:
        for signo in self.late:
            say(f"ddp-doctor: {Interrupt(signo).name} arrived {what}\n")

    def exit_code(self, code: int) -> int:
        """The script's exit status, or 128 + the first stop signal that came after its end."""
        self.late += [s for s in [self.watch.stop_signal()] if s is not None]
        if not self.late:
            return code
        self._note_late("after the script ended; the report above is the run's own")
        return 128 + self.late[0]


def _in_script(frame: Any) -> bool:
    """Whether `frame` runs inside the user's script: run_target (target.py) has called runpy's
    _run_code (the script's module code) and that call is still on the stack."""
    ran = False
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_run_code" and code.co_filename in (runpy.__file__, "<frozen runpy>"):
            ran = True
        elif code.co_name == "run_target" and code.co_filename == target_module.__file__:
            return ran
        frame = frame.f_back
    return False


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
