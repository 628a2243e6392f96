"""What the parent, the forkserver and the ranks agree on: the framing of the control pipe
(length-prefixed pickles), what the forkserver preloads, and the layout of a test's run directory
(where each rank leaves its result, output and stack dump). Each of them dies with its parent
(SIGKILL, processes/tree.py die_with_parent).

Messages, parent -> forkserver: ("run", req, spec), ("signal", req, signum), ("kill", req),
("judge", req, inputs). Forkserver -> parent: ("ready", pid), ("started", req, pids, pgid),
("exited", req, rank, status, time); the judging child exits as rank JUDGE (-1).
"""
from __future__ import annotations

import os
import pickle
import struct
from typing import Any, Iterator

PRELOAD = ("torch", "torch.distributed", "pytest")  # what the forkserver imports before the first fork
PRELOAD_ENV = "DDP_DOCTOR_PRELOAD"                   # how the parent tells it (comma-separated)
JUDGE = -1                                           # the "rank" of the child that judges a failed test


def send(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj)
    view = memoryview(struct.pack("!I", len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class Reader:
    """Length-prefixed pickles from a pipe, fed in whatever chunks os.read returns."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> Iterator[Any]:
        self.buf += data
        while len(self.buf) >= 4:
            (n,) = struct.unpack("!I", self.buf[:4])
            if len(self.buf) < 4 + n:
                return
            msg, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
            yield pickle.loads(msg)


# ---------------------------------------------------------------- the run directory of one test
def result_path(d: str, rank: int) -> str:
    return os.path.join(d, f"result-{rank}.pkl")


def output_path(d: str, name: str, rank: int) -> str:
    """stdout, stderr or stack (faulthandler dump) of one rank."""
    return os.path.join(d, f"{name}-{rank}.txt")


def store_path(d: str) -> str:
    return os.path.join(d, "store")


def ledger_request_path(d: str, rank: int) -> str:
    """The FIFO through which the parent asks a rank for its ledger (rank_pool/ledgers.py)."""
    return os.path.join(d, f"ledger-request-{rank}.fifo")


def judgement_path(d: str) -> str:
    """The judgement of a failed test (rank_pool/judge.py), written by a child of the forkserver."""
    return os.path.join(d, "judgement.json")
