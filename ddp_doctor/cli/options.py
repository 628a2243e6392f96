"""What the subcommands share to read their arguments: UsageError (a usage mistake found after
parsing; main prints it and exits 2) and the argparse validators, one definition each:
timeout_seconds (positive_float; defined in ddp_doctor.time_limit, which `ddp-doctor run` uses too),
int_at_least (positive_int, non_negative_int), threshold, byte_size.
"""
from __future__ import annotations

import argparse
from typing import Callable

# A bound in seconds (above 0, finite, at most one day): the one rule, shared with `ddp-doctor run`.
from ddp_doctor.time_limit import timeout_seconds


class UsageError(Exception):
    """A usage mistake argparse cannot see (e.g. an unknown --select ID): exit 2 with its message."""


positive_float = timeout_seconds  # the name the options used before the bound had a maximum


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number no smaller than `minimum`."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be at least {minimum}")
        return v
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def threshold(text: str) -> tuple[str, float]:
    """An argparse type: KEY=NUMBER, for --threshold."""
    key, sep, value = text.partition("=")
    try:
        if not sep or not key.strip():
            raise ValueError
        return key.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=NUMBER (e.g. shm_min_mib=512)") from None


def byte_size(text: str) -> int:
    """An argparse type: a message size such as 4096, 64K, 256M or 1G (ddp_doctor.comm.arithmetic)."""
    from ddp_doctor.comm.arithmetic import parse_bytes
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
