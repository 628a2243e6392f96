"""SIGTERM, SIGINT and SIGHUP for the parents that watch ranks (`ddp-doctor preflight`'s local
launch, `ddp-doctor run`): SageMaker's StopTrainingJob, a spot interruption, a CI cancel, Kubernetes
and Ctrl-C must end in a report that says the job was interrupted, with where the ranks were,
never in silence or a false "pass".

The parent blocks these signals in its main thread and takes them with sigtimedwait where it would
otherwise sleep, so it learns who sent one (the sender's pid and command name) and can finish its
work (ask the ranks for their stacks and ledgers, end them, write the report) before it exits with
128 + the signal number. Its children get the signals unblocked again (`unblock_in_child`): a
blocked mask survives exec.
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class Interrupt:
    signo: int
    sender_pid: int | None = None
    sender: str | None = None  # the sender's command name, when it could be read
    at: float = field(default_factory=time.time)

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
        if self.sender_pid:
            who = f"pid {self.sender_pid}" + (f" ({self.sender})" if self.sender else "")
            return f"{self.name} from {who}"
        return self.name

    def to_dict(self) -> dict[str, Any]:
        return {"signal": self.name, "signo": self.signo, "sender_pid": self.sender_pid, "sender": self.sender}


def _command_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


class SignalCatcher:
    """`with SignalCatcher() as catcher: ... catcher.wait(0.5)` in place of time.sleep(0.5)."""

    def __init__(self) -> None:
        self.caught: Interrupt | None = None
        self._old: Any = None

    def __enter__(self) -> "SignalCatcher":
        self._old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        return self

    def __exit__(self, *exc: Any) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old)

    def wait(self, seconds: float) -> Interrupt | None:
        """Sleep up to `seconds`; the first stop signal that arrives ends the wait and is kept."""
        if self.caught is not None:
            return self.caught
        info = signal.sigtimedwait(STOP_SIGNALS, max(0.0, seconds))
        if info is None:
            return None
        pid = info.si_pid or None
        self.caught = Interrupt(info.si_signo, pid, _command_name(pid) if pid else None)
        return self.caught


def unblock_in_child() -> None:
    """For preexec_fn: the launched process handles these signals as usual."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
