"""What the processes passed to init_process_group, brought to the report wherever `ddp-doctor run`
runs: the parent of launched ranks (stall_watch.py), and the one process of `ddp-doctor run script.py`
whose script starts its own ranks (torch.multiprocessing.spawn, multiprocessing), where
`InitWatch` ends processes that wait in init with arguments that cannot work instead of letting
them wait for torch's timeout (30 minutes). The rules are in checks/init_arguments.py.

- `judge_waiting`: the bounded wait before a judgement (a grace inside init; every launched rank,
  or every child of a spawn, has called; or nobody new for UNCOUNTED_WAIT seconds).
- `InitWatch`: the judgement, and the ending, in the one-process mode; under an outside launcher
  (no ddp-doctor parent), a rank's own call whose rank another process claimed in the job's store
  (probes/rank_claims.py: a duplicate across nodes).
"""
from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from typing import Any, Callable

INIT_GRACE = 2.0  # seconds a process may wait inside init_process_group before its arguments are judged
INIT_WAIT_FOR_ALL = 15.0  # seconds the judgement waits for a launched rank that has not called init yet
UNCOUNTED_WAIT = 60.0  # seconds without a new call before processes nobody counted (no launcher, no
# torch.multiprocessing.spawn: multiprocessing.Process, subprocess) are taken to be all there are
WATCH_INTERVAL = 0.5  # seconds between two looks at the init records (one-process mode)


def judge_waiting(calls: list[dict[str, Any]], now: float, launched: int = 0) -> tuple[bool, bool]:
    """(blocking, settled): whether processes wait inside init_process_group with arguments that
    cannot work, so the job should be ended now; and whether every process that will call init
    has had its chance (what `settled` means to the rules). `launched`: how many ranks a launcher
    started (0 when none did); the judgement waits for all of them, or INIT_WAIT_FOR_ALL."""
    from ddp_doctor.checks.init_arguments import blocking, init_argument_findings, waiting_in_init
    waits = [now - float(c.get("time") or now) for c in calls if waiting_in_init(c)]
    if not waits or max(waits) <= INIT_GRACE:
        return False, False
    newest = max(float(c.get("time") or 0) for c in calls)
    settled = now - newest > UNCOUNTED_WAIT
    # Judge once every launched process has called (a finding then names all the ranks it
    # concerns), or, if one never gets there, after the longer bound.
    called = {c.get("pid") for c in calls if c.get("launched_rank") and (c.get("launcher") or {}).get("world_size")}
    if len(called) < launched and max(waits) <= INIT_WAIT_FOR_ALL:
        return False, settled
    return blocking(init_argument_findings(calls, settled=settled), calls), settled


def calls_since(run_dir: str, since: float) -> list[dict[str, Any]]:
    from ddp_doctor.training import records
    return [c for c in records.read_init_calls(run_dir) if float(c.get("time") or 0) >= since]


class InitWatch:
    """One-process mode (`ddp-doctor run script.py`, no launcher): a daemon thread that reads the
    init records the script's own processes leave (its spawned children record through
    sitecustomize) and, when they wait inside init_process_group with arguments that cannot work,
    claims the ending from the rank's watch, ends those processes, reports through `report`
    (called with settled=True) and ends this process with exit status 124."""

    def __init__(self, run_dir: str, watch: Any, since: float, report: Callable[[], None],
                 *, own_dir: bool = True, interval: float = WATCH_INTERVAL, claims_of: int | None = None) -> None:
        self.run_dir, self.watch, self.since, self.report = run_dir, watch, since, report
        self.own_dir, self.interval = own_dir, interval
        self.claims_of = claims_of  # a rank under an outside launcher: only its own call, with others' claims
        self._stop = threading.Event()

    def start(self) -> "InitWatch":
        threading.Thread(target=self._loop, name="ddp-doctor-init-watch", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self.claims_of is not None:  # its rank held by another process (the job's store said)
                    calls = self._own_claims()
                    if calls is None:
                        return  # its init returned well: nothing left to watch
                else:
                    calls = calls_since(self.run_dir, self.since)
                stuck = bool(calls) and judge_waiting(calls, time.time())[0]
            except Exception:  # noqa: BLE001 - the watch never breaks the job
                stuck = False
            if stuck and not self._stop.is_set() and self.watch.phase == "training":
                self._end()
                return

    def _own_claims(self) -> list[dict[str, Any]] | None:
        """This rank's init record, when the job's store showed its rank claimed by another
        process; None once its init returned well (one small file read a look, at init only)."""
        import json

        from ddp_doctor.checks.init_arguments import other_claims
        from ddp_doctor.training import records
        try:
            with open(records.init_call_path(self.run_dir, int(self.claims_of or 0)), encoding="utf-8") as f:
                call = json.load(f)
        except (OSError, ValueError):
            return []
        if not isinstance(call, dict) or float(call.get("time") or 0) < self.since:
            return []
        if call.get("done") and call.get("ok"):
            return None
        return [call] if other_claims(call) else []

    def _end(self) -> None:
        from ddp_doctor.exit_codes import EXIT_HANG
        from ddp_doctor.processes.tree import end_descendants
        if not self.watch.claim_stop():
            return  # a stop signal is being reported
        if self._stop.is_set():  # the script ended meanwhile: its own ending is reported
            self.watch.stopping = False
            return
        try:
            sys.stderr.write("ddp-doctor: processes wait inside init_process_group with arguments that cannot "
                             f"work; ending them instead of waiting for torch's timeout (exit {EXIT_HANG})\n")
            self.report()
        except Exception as e:  # noqa: BLE001 - the processes are ended below either way
            sys.stderr.write(f"ddp-doctor: the report could not be made ({e!r})\n")
        finally:
            end_descendants(grace=None)  # at once: they wait in init with nothing to write
            if self.own_dir:
                shutil.rmtree(self.run_dir, ignore_errors=True)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_HANG)
