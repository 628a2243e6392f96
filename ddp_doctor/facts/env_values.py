"""Small, total parsers for environment values: they never raise, they say what was wrong."""
from __future__ import annotations

import json
from typing import Any, Mapping


class Invalid:
    """A value that was present but could not be parsed; keeps the raw text for the message."""

    __slots__ = ("raw", "why")

    def __init__(self, raw: str, why: str) -> None:
        self.raw, self.why = raw, why

    def __repr__(self) -> str:
        return f"Invalid({self.raw!r}: {self.why})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Invalid) and (self.raw, self.why) == (other.raw, other.why)


def env_int(env: Mapping[str, str], name: str) -> int | None | Invalid:
    """None when unset or empty; an int; or Invalid when it is not a whole number."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip())
    except ValueError:
        return Invalid(raw, "not an integer")


def env_json(env: Mapping[str, str], name: str) -> Any:
    """None when unset; the decoded JSON; or Invalid when it is not JSON."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return json.loads(raw)
    except ValueError as e:
        return Invalid(raw, f"not valid JSON ({e.msg})")


def env_bool(env: Mapping[str, str], name: str) -> bool:
    return (env.get(name) or "").strip().lower() in ("1", "true", "yes", "on")


def as_int(value: Any) -> int | None:
    """The int in a parsed value, or None when it is unset or invalid."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
