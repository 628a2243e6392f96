"""How the probes go around torch's functions: `wrap_in_place` replaces an attribute by a wrapper
(once: a wrapped function is marked), and `record_quietly` runs a wrapper's recording so that a
failure in it is noted in the record and never reaches the user's call."""
from __future__ import annotations

import functools
from typing import Any, Callable

from ddp_doctor.training.probes.recorder import Recorder


def wrap_in_place(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """owner.name = make(original), unless it is already one of ours."""
    orig = getattr(owner, name)
    if getattr(orig, "_ddp_doctor_probe", False):
        return
    new = make(orig)
    functools.update_wrapper(new, orig)
    new._ddp_doctor_probe = True  # type: ignore[attr-defined]
    new._ddp_doctor_orig = orig  # type: ignore[attr-defined]
    setattr(owner, name, new)


def record_quietly(rec: Recorder, what: str, record: Callable[[], Any]) -> Any:
    """Run a wrapper's recording; whatever goes wrong in it is noted in the record, never raised
    into the user's call (which then runs, and fails or not, exactly as without the probes)."""
    try:
        return record()
    except Exception as e:  # noqa: BLE001 - a probe never breaks the job
        rec.note_error(what, e)
        return None
