"""Run a callable with a time limit: the one way ddp-doctor bounds a call that might block (a check,
a DNS lookup, a store connection, a teardown). The call runs in a daemon thread; past the limit it
is abandoned (a thread cannot be killed) and the caller carries on with what it knows.

Also the one rule for a bound a user gives in seconds (`--timeout`, `--hang-timeout`):
usable_timeout, and timeout_seconds, its argparse type, which both the CLI's options
(ddp_doctor/cli/options.py) and `ddp-doctor run`'s own parser (ddp_doctor/cli/run_argv.py) use;
the pytest plugin's timeout settings (pytest_plugin/settings.py) use usable_timeout.
"""
from __future__ import annotations

import math
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, Mapping, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


# The longest bound a user may give: one day. Every wait takes it as it is (thread joins, socket and
# store timeouts, torch's timedelta, torchrun's whole seconds); a longer one is no bound in
# practice, and past about 1e9 s the conversions to timedelta and time_t overflow.
MAX_TIMEOUT_S = 86400.0


def usable_timeout(text: str, maximum: float = MAX_TIMEOUT_S) -> float:
    """A bound in seconds from the user's text: a finite number above 0 and at most `maximum`;
    otherwise ValueError with a one-line reason that quotes the text and says what is accepted."""
    accepted = f"a number of seconds above 0 and at most {maximum:g}"
    if maximum == MAX_TIMEOUT_S:
        accepted += " (one day)"
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{text!r} is not a number of seconds; give {accepted}") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is no bound; give {accepted}")
    if value <= 0:
        raise ValueError(f"{text!r} must be more than 0 seconds; give {accepted}")
    if value > maximum:
        raise ValueError(f"{text!r} is more than {maximum:g} seconds; give {accepted}")
    return value


def timeout_seconds(text: str) -> float:
    """usable_timeout as the argparse type of every option that takes a bound: argparse shows an
    ArgumentTypeError's reason, while a ValueError would become its bare "invalid value"."""
    import argparse  # only a command line needs it
    try:
        return usable_timeout(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


@dataclass
class Bounded(Generic[T]):
    """What a bounded call came to: finished in time (with its value or its exception), or not."""
    finished: bool
    value: T | None = None
    error: BaseException | None = None
    traceback: str = ""


def _start(fn: Callable[[], T], name: str) -> tuple[threading.Thread, Bounded[T]]:
    out: Bounded[T] = Bounded(finished=False)

    def target() -> None:
        try:
            out.value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller, never raised in the thread
            out.error, out.traceback = e, traceback.format_exc()
        out.finished = True

    t = threading.Thread(target=target, name=name, daemon=True)
    t.start()
    return t, out


def call_with_time_limit(fn: Callable[[], T], seconds: float, *, name: str = "ddp-doctor-bounded") -> Bounded[T]:
    """Call fn() and wait at most `seconds` for it."""
    t, out = _start(fn, name)
    t.join(max(0.0, seconds))
    return out


def call_until(fn: Callable[[], T], seconds: float, *, stop: Callable[[float], Any] | None = None,
               name: str = "ddp-doctor-bounded") -> tuple[Bounded[T], bool]:
    """Call fn() and wait at most `seconds` for it, as call_with_time_limit; `stop(s)` (optional)
    waits up to s seconds for a reason to give up (a stop signal) and returns it, truthy, when one
    came: the wait then ends at once. Returns what the call came to and whether a stop ended the wait."""
    t, out = _start(fn, name)
    deadline = time.monotonic() + max(0.0, seconds)
    while t.is_alive():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if stop is None:
            t.join(left)
        elif stop(min(0.1, left)):
            return out, True
    return out, False


def call_all_with_time_limit(calls: Mapping[K, Callable[[], Any]], seconds: float, *,
                             name: str = "ddp-doctor-bounded") -> dict[K, Bounded[Any]]:
    """Start every call at once and wait at most `seconds` for all of them together."""
    started = {key: _start(fn, f"{name}-{key}") for key, fn in calls.items()}
    deadline = time.monotonic() + seconds
    for t, _ in started.values():
        t.join(max(0.0, deadline - time.monotonic()))
    return {key: out for key, (_, out) in started.items()}
