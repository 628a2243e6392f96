"""SIGTERM, SIGINT and SIGHUP for the parents that watch ranks (`ddp-doctor preflight`'s local
launch, `ddp-doctor run`): SageMaker's StopTrainingJob, a spot interruption, a CI cancel, Kubernetes
and Ctrl-C must end in a report that says the job was interrupted, with where the ranks were,
never in silence or a false "pass".

The parent blocks these signals in its main thread and takes them with sigtimedwait where it would
otherwise sleep, so it learns who sent one (the sender's pid and command name) and can finish its
work (ask the ranks for their stacks and ledgers, end them, write the report) before it exits with
128 + the signal number. They stay blocked until the report is written and published: a second
signal (an impatient Ctrl-C, a scheduler that repeats its SIGTERM) or one that arrives while the
report is written is taken with `drain`, noted, and never kills the parent in the middle of the
write. Its children get the signals unblocked again (`unblock_in_child`): a blocked mask survives
exec.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class Interrupt:
    signo: int
    sender_pid: int | None = None
    sender: str | None = None  # the sender's command name, when it could be read
    at: float = field(default_factory=time.time)
    to: str | None = None  # whom it was sent to, when not to the process reporting it (the launcher)
    repeated: tuple["Interrupt", ...] = ()  # stop signals that came after it, while it was reported

    @property
    def name(self) -> str:
        try:
            return signal.Signals(self.signo).name
        except ValueError:
            return f"signal {self.signo}"

    @property
    def exit_code(self) -> int:
        return 128 + self.signo

    def describe(self) -> str:
        text = self.name + (f" to {self.to}" if self.to else "")
        if self.sender_pid:
            who = f"pid {self.sender_pid}" + (f" ({self.sender})" if self.sender else "")
            return f"{text} from {who}"
        return text

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"signal": self.name, "signo": self.signo, "sender_pid": self.sender_pid,
                               "sender": self.sender}
        if self.to:
            out["to"] = self.to
        if self.repeated:
            out["repeated"] = [{k: v for k, v in r.to_dict().items() if k != "repeated"} for r in self.repeated]
        return out


def _command_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


class SignalCatcher:
    """`with SignalCatcher() as catcher: ... catcher.wait(0.5)` in place of time.sleep(0.5). Keep the
    report's writing inside the `with`: leaving it unblocks the signals, and a pending one would
    then end the process with its default action. `hold=True` (a command whose report is its last
    act) keeps them blocked after the `with` too, until the process exits: a stop that comes then
    finds the report written and changes nothing."""

    def __init__(self, hold: bool = False) -> None:
        self.caught: Interrupt | None = None
        self.later: list[Interrupt] = []  # taken by drain: after the first, or after the job ended
        self.hold = hold
        self._old: Any = None

    def __enter__(self) -> "SignalCatcher":
        self._old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        global _EARLY_OLD
        if _EARLY_OLD is not None:  # held since the command began (hold_early): its mask is the one to restore
            self._old, _EARLY_OLD = _EARLY_OLD, None
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.hold or exc[0] is not None:  # an error on the way: the signals act as usual again
            signal.pthread_sigmask(signal.SIG_SETMASK, self._old)

    def wait(self, seconds: float) -> Interrupt | None:
        """Sleep up to `seconds`; the first stop signal that arrives ends the wait and is kept."""
        if self.caught is not None:
            return self.caught
        self.caught = _take(seconds)
        return self.caught

    def wait_new(self, seconds: float) -> Interrupt | None:
        """Wait up to `seconds` for a stop signal that comes now (a report's upload waits so), even
        when one was already caught: the new one is kept (as `caught`, else in `later`) and returned."""
        got = _take(seconds)
        if got is not None:
            if self.caught is None:
                self.caught = got
            else:
                self.later.append(got)
        return got

    def drain(self) -> list[Interrupt]:
        """The stop signals pending now (taken without waiting), kept in `later` and returned: a
        second signal while the first is being reported, or one that came while the report was
        written. The caller notes them; none of them ends the process before the report is out."""
        got = []
        while (one := _take(0.0)) is not None and len(got) < len(STOP_SIGNALS):  # pending ones do not queue
            got.append(one)
        self.later += got
        return got

    def stopped(self) -> Interrupt | None:
        """The stop that ended the run, with the stop signals taken after it (`repeated`)."""
        if self.caught is None:
            return None
        return replace(self.caught, repeated=tuple(self.later)) if self.later else self.caught

    def first(self) -> Interrupt | None:
        """The first stop signal taken, whether it ended the run or came after its end."""
        return self.caught or (self.later[0] if self.later else None)

    @contextlib.contextmanager
    def interrupting(self) -> Iterator[None]:
        """Around work the main thread does itself, with no wait to take a stop in (`analyze`
        reading its inputs, a blocking read of stdin, boto3's calls): a stop signal ends that work
        at once by raising Stopped in the main thread, wherever it is (a blocking read or a socket
        wait returns EINTR). The signals stay blocked in every thread, so a watcher thread takes
        them with sigtimedwait (the sender known, as `wait` knows it) and wakes the main thread
        with WAKE_SIGNAL, whose handler raises Stopped once, and only for a stop taken here. One
        pending when the block starts (held since the command began) raises at once. A stop taken
        as the work ended, once the block is left, is kept in `later` (a stop after the work), never
        raised. Outside the main thread no handler can be installed: the work runs to its end and
        the stop is then in `caught`."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        if self.caught is None:
            self.caught = _take(0.0)  # pending since the command began (hold_early)
        if self.caught is not None:
            raise Stopped(self.caught)
        state = {"working": True, "raised": False}
        main = threading.get_ident()

        def wake(_signo: int, _frame: Any) -> None:
            if state["working"] and not state["raised"] and self.caught is not None:
                state["raised"] = True
                raise Stopped(self.caught)

        def watch() -> None:
            while state["working"]:
                got = _take(WATCH_SLICE_S)
                if got is not None:
                    self.caught = got
                    signal.pthread_kill(main, WAKE_SIGNAL)
                    return  # one stop ends the work; later ones are taken by drain

        old = signal.signal(WAKE_SIGNAL, wake)
        old_mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, (WAKE_SIGNAL,))
        watcher = threading.Thread(target=watch, name="ddp-doctor-stop-watch", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            state["working"] = False  # first: from here the wake raises nothing (no call before it)
            watcher.join()
            if self.caught is not None and not state["raised"]:  # taken as the work ended: after it
                self.later.insert(0, self.caught)
                self.caught = None
            # a wake sent and not yet handled acts nowhere: taken here, then the old handler again
            signal.pthread_sigmask(signal.SIG_BLOCK, (WAKE_SIGNAL,))
            while signal.sigtimedwait((WAKE_SIGNAL,), 0) is not None:
                pass
            signal.signal(WAKE_SIGNAL, old)
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


class Stopped(BaseException):
    """Raised in the main thread by SignalCatcher.interrupting when a stop signal came during the
    work it guards. A BaseException, as KeyboardInterrupt: code that catches Exception (a library's
    retry loop) lets it through."""

    def __init__(self, stop: Interrupt) -> None:
        super().__init__(stop.describe())
        self.stop = stop


# The watcher's wake-up for the main thread (interrupting): a real-time signal no other part uses
# (the ranks ask for stacks with SIGUSR1 and SIGUSR2); SIGUSR2 where there is none (not Linux)
WAKE_SIGNAL = int(signal.SIGRTMIN) + 1 if hasattr(signal, "SIGRTMIN") else int(signal.SIGUSR2)
WATCH_SLICE_S = 0.1  # how often the watcher looks whether the work ended (a stop wakes it at once)


_EARLY_OLD: Any = None  # the signal mask the process began with, while hold_early holds the stop signals


def hold_early() -> None:
    """Block the stop signals from the first instruction of a parent command (cli's main, before
    its heavy imports), so that one sent while it starts waits, pending, for the SignalCatcher that
    reports it (which takes the hold over), instead of killing the process before it can write a
    report. A path that turns out to report no stop (a rank, a usage error) calls release_early."""
    global _EARLY_OLD
    if _EARLY_OLD is None:
        _EARLY_OLD = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def release_early() -> None:
    """Give up hold_early's hold (when no SignalCatcher took it over): the mask the process began
    with again; a stop signal pending now acts as it would have (its handler, else its default)."""
    global _EARLY_OLD
    if _EARLY_OLD is not None:
        old, _EARLY_OLD = _EARLY_OLD, None
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _take(seconds: float) -> Interrupt | None:
    info = signal.sigtimedwait(STOP_SIGNALS, max(0.0, seconds))
    if info is None:
        return None
    pid = info.si_pid or None
    return Interrupt(info.si_signo, pid, _command_name(pid) if pid else None)


def note_later(signals: list[Interrupt], what: str) -> None:
    """One stderr line per stop signal taken after the first one (or after the job's end), saying
    `what` became of it: noted, never lost, and it ended nothing half-way."""
    for s in signals:
        try:
            sys.stderr.write(f"ddp-doctor: {s.describe()} arrived {what}\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed stderr takes nothing
            pass


def unblock_in_child() -> None:
    """For preexec_fn: the launched process handles these signals as usual."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
