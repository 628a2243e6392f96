"""Each rank's ledger of collectives in a distributed test, kept as `ddp-doctor run` keeps it
(training/run/ledger.py), so that a failing or hung test is judged the same way (rank side).

- Before the process group: torch's flight recorder on (ledger.recorder_env, unless the test's
  environment chose a size) and the call-site wrappers of training/probes/collective_sites.py on
  torch.distributed's collectives, so each entry made from the test gets its file:line.
- The rank leaves ledger-RANK.json in the test's run directory at the endings it lives through:
  "failed" (the test raised: the collective it raised from is marked), "finished" (the test
  function returned, or called pytest.skip, while a peer is still in the test), and at a hang
  "hung" (or "finished" for a rank that returned and waits for its peers), written by a daemon
  thread when the parent asks: the main thread may be blocked inside a collective.
- The parent asks through a FIFO per rank (wire.ledger_request_path): the thread blocks opening it
  (no polling), the parent opens it without blocking and writes one byte. With the ledger, the
  thread writes where the main thread was (hb-RANK.json: its innermost line of the test's code and
  whether it sat in a collective), which the judgement reads as `ddp-doctor run` reads heartbeats.

Nothing here imports torch at import time: the forkserver and the parent import this package.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from ddp_doctor.pytest_plugin.rank_pool.wire import ledger_request_path

LEFT = "finished"  # a rank that returned from the test, or skipped it: it issues no more collectives


def preload() -> None:
    """Import now what a rank needs for its ledger (called by the forkserver once torch is loaded),
    so that each forked rank has it at no cost."""
    try:
        import ddp_doctor.training.probes.collective_sites  # noqa: F401
        import ddp_doctor.training.probes.patching  # noqa: F401
        import ddp_doctor.training.records  # noqa: F401
        import ddp_doctor.training.run.ledger  # noqa: F401
        import ddp_doctor.training.run.nccl_dumps  # noqa: F401
        import ddp_doctor.training.run.watchdog  # noqa: F401
        from ddp_doctor.facts.frames import not_user_code_dirs
        not_user_code_dirs()  # its first call imports (sysconfig's data): not in a rank's thread at a hang
    except Exception:  # noqa: BLE001 - each rank imports what it can again
        pass


class RankLedger:
    """This rank's ledger of collectives during one test."""

    def __init__(self, run_dir: str, rank: int, world_size: int) -> None:
        self.dir, self.rank, self.world_size = run_dir, rank, world_size
        self.since_ns = 0                 # the ledger keeps the test's collectives only
        self.position: str | None = None  # None while the test runs; then "finished" or "failed"
        self.where: str | None = None     # set with a position: the line the rank left the test at
        self._lock = threading.Lock()     # one writer at a time: the main thread or the request thread

    # ------------------------------------------------------------ before the process group
    def prepare(self) -> None:
        """Recorder on, call sites wrapped, the request thread listening. Never raises: a ledger
        that cannot be kept leaves the test as it was."""
        try:
            from ddp_doctor.training.probes.install import wrap_collectives
            from ddp_doctor.training.run import ledger, watchdog  # noqa: F401 - imported now, not at a hang
            ledger.recorder_env(os.environ)
            wrap_collectives()
        except Exception:  # noqa: BLE001 - a torch whose internals moved: the test runs without the ledger
            pass
        path = ledger_request_path(self.dir, self.rank)
        try:
            os.mkfifo(path, 0o600)
        except OSError:
            return
        threading.Thread(target=self._serve, args=(path,), name="ddp-doctor-ledger", daemon=True).start()

    def test_started(self) -> None:
        self.since_ns = time.time_ns()

    # ------------------------------------------------------------ the endings the rank lives through
    def failed(self, exc: dict[str, Any]) -> None:
        """The test raised `exc` (type, message, traceback): the ledger marks the collective it came
        out of, and the rank's line is the exception's innermost line of the test's code."""
        from ddp_doctor.training.run import ledger
        in_collective, where = ledger.from_exception(exc)
        with self._lock:
            self.position, self.where = "failed", where
            self._write("failed", where, failed_in_collective=in_collective)

    def left(self, how: str, peers_still_in_test: bool) -> None:
        """The test function returned (or skipped) on this rank. The ledger is written only while
        a peer is still in the test (then it may be waited for); otherwise, or later, on request."""
        with self._lock:
            self.position, self.where = LEFT, how
            if peers_still_in_test:
                self._write(LEFT, how)

    # ------------------------------------------------------------ at a hang: the parent asks
    def _serve(self, path: str) -> None:
        while True:
            try:
                fd = os.open(path, os.O_RDONLY)  # blocks until the parent opens it to ask
            except OSError:
                return
            try:
                asked = os.read(fd, 16)
            except OSError:
                asked = b""
            finally:
                os.close(fd)
            if asked:
                self.on_request()

    def on_request(self) -> None:
        """Where the main thread is, and the ledger: "hung" while the test runs, else the position
        the rank left the test with."""
        from ddp_doctor.facts.frames import describe, stack_of
        from ddp_doctor.training import records
        try:
            here = describe(stack_of(threading.main_thread().ident or 0))
        except Exception:  # noqa: BLE001 - a stack that cannot be read: the position is unknown
            here = {"where": None, "innermost": None, "in_collective": False}
        with self._lock:
            position = self.position or "hung"
            if self.position is not None:  # not in the test any more: where it left it
                here = {**here, "where": self.where, "in_collective": False}
            records.write_heartbeat(self.dir, self.rank, {"time": time.time(), "phase": "test",
                                                          "position": position, **here})
            self._write(position, here.get("where") if self.position is None else self.where)

    def _write(self, position: str, where: str | None, *, failed_in_collective: bool = False) -> None:
        from ddp_doctor.training import records
        from ddp_doctor.training.probes import collective_sites
        from ddp_doctor.training.run import ledger
        if not collective_sites.calls() and _recorder_on_and_empty():
            # Nothing was recorded in this process at all: the rank issued no collective, and nothing
            # was lost (ledger.write can tell only from a first record that is not there).
            records.write_ledger(self.dir, self.rank, {
                "source": "flight_recorder", "position": position, "steps": None, "where": where,
                "since_ns": self.since_ns, "complete": True, "entries": [], "pg_config": {}})
            return
        ledger.write(self.dir, self.rank, position, since_ns=self.since_ns, where=where,
                     failed_in_collective=failed_in_collective)


def _recorder_on_and_empty() -> bool:
    from ddp_doctor.training.run import ledger
    size = os.environ.get(ledger.BUFFER_ENV) or os.environ.get(ledger.OLD_BUFFER_ENV) or ""
    if not size.strip().isdigit() or int(size) <= 0:
        return False
    data = ledger.dump()
    return data is not None and not data.get("entries")


def ask(run_dir: str, ranks: list[int]) -> list[int]:
    """Parent side: ask each live rank's request thread for its ledger; the ranks that were asked
    (a rank whose thread is not listening, or that has gone, is not)."""
    asked = []
    for r in ranks:
        try:
            fd = os.open(ledger_request_path(run_dir, r), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody reads; ENOENT: never made
            continue
        try:
            os.write(fd, b"h")
            asked.append(r)
        except OSError:
            pass
        finally:
            os.close(fd)
    return asked


def written_since(run_dir: str, rank: int, since: float) -> bool:
    """Parent side: the rank's ledger was written at `since` or later."""
    import json

    from ddp_doctor.training import records
    try:
        with open(records.ledger_path(run_dir, rank), encoding="utf-8") as f:
            return float(json.load(f).get("time") or 0) >= since
    except (OSError, ValueError, AttributeError, TypeError):
        return False
