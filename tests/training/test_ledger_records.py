"""records' ledger files and the ledger helpers, without processes."""
from __future__ import annotations

import os

import pytest

from ddp_doctor.facts.own_env import OWN_ENV
from ddp_doctor.training import records
from ddp_doctor.training.run import ledger


def test_ledgers_round_trip_per_rank(tmp_path):
    d = str(tmp_path)
    assert records.ledger_path(d, 3) == os.path.join(d, "ledger-3.json")
    records.write_ledger(d, 0, {"position": "finished", "entries": [{"collective_seq_id": 1}]})
    records.write_ledger(d, 1, {"position": "hung", "entries": []})
    got = records.read_ledgers(d)
    assert sorted(got) == [0, 1]
    assert got[0]["position"] == "finished" and got[0]["entries"] == [{"collective_seq_id": 1}]
    assert got[1]["pid"] == os.getpid() and got[1]["time"] > 0
    records.write_ledger(d, 1, {"position": "failed"})  # a later ending replaces the earlier
    assert records.read_ledgers(d)[1]["position"] == "failed"
    assert not [p for p in os.listdir(d) if p.endswith(".tmp")]


def test_bad_ledger_files_are_skipped_and_writes_never_raise(tmp_path):
    d = str(tmp_path)
    (tmp_path / "ledger-0.json").write_text("{not json")
    (tmp_path / "ledger-1.json").write_text('{"no": "rank"}')
    assert records.read_ledgers(d) == {}
    records.write_ledger(str(tmp_path / "missing" / "dir"), 0, {"position": "finished"})  # no raise
    assert records.read_ledgers(str(tmp_path / "missing")) == {}


def test_recorder_env_never_overrides_the_users_size(monkeypatch):
    from ddp_doctor.training.run import nccl_dumps
    monkeypatch.setattr(nccl_dumps, "torch_before", lambda major, minor: False)  # torch 2.8 on: one name
    env: dict[str, str] = {}
    ledger.recorder_env(env)
    assert env == {"TORCH_FR_BUFFER_SIZE": "2000", OWN_ENV: "TORCH_FR_BUFFER_SIZE"}  # marked as ddp-doctor's
    env = {"TORCH_FR_BUFFER_SIZE": "50"}
    ledger.recorder_env(env)
    assert env == {"TORCH_FR_BUFFER_SIZE": "50"}
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}  # the user's older spelling, even turning it off
    ledger.recorder_env(env)
    assert env == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}


def test_without_a_flight_recorder_no_ledger_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger, "dump", lambda: None)
    assert ledger.write(str(tmp_path), 0, "finished") is False
    assert records.read_ledgers(str(tmp_path)) == {}


def test_a_ledger_keeps_the_entries_since_the_script_started(tmp_path, monkeypatch):
    entries = [{"collective_seq_id": 9, "time_created_ns": 100}, {"collective_seq_id": 1, "time_created_ns": 200}]
    monkeypatch.setattr(ledger, "dump", lambda: {"entries": entries, "pg_config": {"0": {}}})
    assert ledger.write(str(tmp_path), 2, "failed", since_ns=150, steps=4, where="train.py:3 in <module>")
    led = records.read_ledgers(str(tmp_path))[2]
    assert led["entries"] == [entries[1]] and led["position"] == "failed"
    assert (led["steps"], led["where"], led["pg_config"]) == (4, "train.py:3 in <module>", {"0": {}})
    assert ledger.wait_for(str(tmp_path), [2], led["time"] - 1, 0.0) == {2: led}
    assert ledger.wait_for(str(tmp_path), [2, 3], 0, 0.2).keys() == {2}  # bounded: rank 3 never writes


def test_entries_get_the_site_of_the_python_call_whose_window_holds_them():
    from ddp_doctor.training.probes.collective_sites import annotate
    calls = [[100, 200, "all_reduce", "train.py:10"], [300, None, "barrier", "train.py:12"]]
    entries = [{"time_created_ns": 150}, {"time_created_ns": 250}, {"time_created_ns": 350}, {"time_created_ns": 50}]
    annotate(entries, calls)
    assert entries[0]["user_site"] == "train.py:10" and entries[0]["user_op"] == "all_reduce"
    assert "user_site" not in entries[1]  # between calls: DDP's own (C++) collective
    assert entries[2]["user_site"] == "train.py:12"  # the call still running
    assert "user_site" not in entries[3]


def test_the_wrapper_records_the_callers_line_once_for_nested_calls():
    from ddp_doctor.training.probes import collective_sites as cs
    inner = cs.collective_wrapper("all_gather")(lambda: "inner")
    outer = cs.collective_wrapper("all_gather_object")(lambda: inner())
    before = len(cs.calls())
    assert outer() == "inner"
    new = cs.calls()[before:]
    assert len(new) == 1 and new[0][2] == "all_gather_object" and new[0][1] is not None
    assert "test_ledger_records.py:" in new[0][3]  # this test's line, not the wrappers' own


def test_a_collective_that_raises_calls_the_failure_hooks_first_and_the_exception_goes_on(monkeypatch):
    # a Ray Train worker's exception stays in the worker (Ray hands it to the driver): its ledger is
    # left by this hook (child_beat.py), while the collective's state is still the failed one
    from ddp_doctor.training.probes import collective_sites as cs
    monkeypatch.setattr(cs, "_on_failure", [])
    seen = []

    def broken_hook():
        raise OSError("a hook that breaks changes nothing")

    cs.on_failure(lambda: seen.append([c[1] is not None for c in cs.calls()][-1]))
    cs.on_failure(broken_hook)

    def raises(t):
        raise RuntimeError("Gloo: sizes differ")

    with pytest.raises(RuntimeError, match="sizes differ"):
        cs.collective_wrapper("all_reduce")(raises)(1)
    assert seen == [True]  # called once, with the call marked ended
    assert cs.collective_wrapper("barrier")(lambda: "ok")() == "ok" and seen == [True]  # not on success


def test_a_process_with_no_group_and_no_collective_leaves_no_ledger(tmp_path, monkeypatch):
    # the driver of a Ray Train job (or mp.spawn's parent) runs as rank 0 of ddp-doctor's view: an
    # empty ledger-0.json from it would take the place of its rank 0 worker's
    monkeypatch.setattr(ledger, "dump", lambda: {"entries": [], "pg_config": {}})
    monkeypatch.setattr(ledger, "default_group_is_up", lambda: False)
    assert ledger.write(str(tmp_path), 0, "failed", where="") is False
    assert records.read_ledgers(str(tmp_path)) == {}


def test_an_exception_out_of_a_collective_is_told_apart():
    from torch.distributed import distributed_c10d
    tb = ('Traceback (most recent call last):\n  File "/w/train.py", line 15, in <module>\n'
          f'  File "{distributed_c10d.__file__}", line 2, in all_reduce\n')
    assert ledger.from_exception({"type": "RuntimeError", "message": "boom", "traceback": tb}) == \
        (True, "/w/train.py:15 in <module>")
    # from DDP's reducer inside backward(): no torch.distributed frame, but a lost peer's message
    tb2 = 'Traceback (most recent call last):\n  File "/w/train.py", line 9, in <module>\n'
    msg = "[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1"
    assert ledger.from_exception({"type": "RuntimeError", "message": msg, "traceback": tb2})[0] is True
    assert ledger.from_exception({"type": "ValueError", "message": "bad", "traceback": tb2}) == \
        (False, "/w/train.py:9 in <module>")
    assert ledger.from_exception(None) == (False, None)


def test_the_ledger_names_the_cause_and_the_waiting_ranks_errors_become_consequences():
    from ddp_doctor.checks.causes import with_ledgers
    from ddp_doctor.checks.internal import event_finding
    from ddp_doctor.checks.rank_endings import RANK_RAISED
    from ddp_doctor.checks.stalls import RANK_HUNG

    def e(seq, op, n, t, **kw):
        return {"collective_seq_id": seq, "profiling_name": f"gloo:{op}", "input_sizes": [[n]],
                "input_dtypes": ["Float"], "process_group": ["0", "default_pg"], "retired": True,
                "time_created_ns": t, "record_id": seq - 1, **kw}
    ledgers = {0: {"rank": 0, "position": "failed", "steps": 3, "time": 9.0,
                   "entries": [e(1, "all_reduce", 5, 1_000_000_000),
                               e(2, "all_reduce", 5, 2_000_000_000, failed_here=True)]},
               1: {"rank": 1, "position": "destroyed", "steps": 3, "time": 8.0,
                   "entries": [e(1, "all_reduce", 5, 1_000_000_000)]}}
    raised = event_finding(RANK_RAISED, "rank 0 raised RuntimeError: closed", rank=0, phase="training")
    raised.time = 5.0
    hung = event_finding(RANK_HUNG, "no progress", rank=None, ranks=[0], phase="training")
    out = with_ledgers([raised, hung], ledgers)
    cause = [f for f in out if f.id == "DDP892"]
    assert cause and cause[0].ranks == [1] and cause[0].time == 2.0
    assert raised.caused_by == "DDP892"
    assert hung.caused_by is not None
    # nothing to explain: the findings stay as they were
    plain = event_finding(RANK_RAISED, "rank 1 raised ValueError", rank=1, phase="training")
    assert with_ledgers([plain], {}) == [plain] and plain.caused_by is None


def test_without_a_flight_recorder_the_python_calls_are_the_ledger(tmp_path, monkeypatch):
    import torch

    from ddp_doctor.training.probes import collective_sites as cs
    monkeypatch.setattr(cs, "_detail", True)
    monkeypatch.setattr(cs, "_calls", cs.collections.deque(maxlen=cs.MAX_CALLS))
    monkeypatch.setattr(cs, "_recorded", 0)
    monkeypatch.setattr(ledger, "dump", lambda: None)
    all_reduce = cs.collective_wrapper("all_reduce")(lambda t, group=None: None)
    barrier = cs.collective_wrapper("barrier")(lambda group=None: None)
    all_reduce(torch.ones(3))
    barrier()
    assert ledger.write(str(tmp_path), 0, "finished", where="")
    led = records.read_ledgers(str(tmp_path))[0]
    assert led["source"] == "python_calls" and led["complete"] is True
    got = [(e["collective_seq_id"], e["profiling_name"], e["input_sizes"], e["input_dtypes"], e["retired"])
           for e in led["entries"]]
    assert got == [(1, "python:all_reduce", [[3]], ["Float"], True), (2, "python:barrier", [], [], True)]
    assert all("test_ledger_records.py:" in e["user_site"] for e in led["entries"])
    # aligned like the flight recorder's: a rank whose all_reduce had 4 elements differs at #1
    from ddp_doctor.checks.collectives import ledger_findings
    other = {**led, "rank": 1, "entries": [{**led["entries"][0], "input_sizes": [[4]]}, led["entries"][1]]}
    found = ledger_findings({0: led, 1: other})
    assert [f.id for f in found] == ["DDP890"] and "Float[3]" in found[0].message


def test_an_ending_put_in_the_job_store_is_redacted(tmp_path):
    """Endings travel through the launcher's store (no authentication) to other nodes' run
    directories: a secret in the failing rank's error message must not travel with them."""
    from ddp_doctor.training import records
    from ddp_doctor.training.run.endings import ending_of
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    records.write_outcome(str(tmp_path), 1, {"exit_code": 1, "exception": {
        "type": "RuntimeError", "message": f"upload failed: AWS_SECRET_ACCESS_KEY={secret}",
        "traceback": f"Traceback ...\nRuntimeError: upload failed: AWS_SECRET_ACCESS_KEY={secret}"}})
    ending = ending_of(str(tmp_path), 1)
    assert ending["outcome"]["exception"]["type"] == "RuntimeError"
    assert "AWS_SECRET_ACCESS_KEY=" in ending["outcome"]["exception"]["message"]
    assert secret not in repr(ending)


def test_records_of_an_earlier_job_in_a_shared_run_directory_are_not_this_jobs(tmp_path):
    """torchrun's default --rdzv-id is "none": jobs on a host share /tmp/ddp-doctor-run-none. An
    earlier job's ledger request, heartbeats and outcomes must not count for this one."""
    import json
    import time
    run_dir = str(tmp_path)
    old = time.time() - 600
    ledger.request(run_dir, reason="peer failed")
    with open(records.ledger_request_path(run_dir), "w", encoding="utf-8") as f:
        json.dump({"time": old, "reason": "peer failed"}, f)
    records.write_json(records.heartbeat_path(run_dir, 3), {"rank": 3, "time": old, "phase": "training"})
    records.write_heartbeat(run_dir, 1, {"time": time.time(), "phase": "training"})
    records.write_json(records.outcome_path(run_dir, 1), {"rank": 1, "time": old, "exit_code": 0})
    since = time.time() - records.SAME_JOB
    assert not ledger.requested(run_dir, since) and ledger.requested(run_dir)
    assert ledger.live_ranks(run_dir, but=0, since=since) == [1]  # not 3 (gone), 1 is not ended
    assert ledger.live_ranks(run_dir, but=0) == [3]  # without the bound: both misread
    ledger.request(run_dir, reason="peer failed")
    assert ledger.requested(run_dir, since)


def test_stacks_of_a_rank_that_took_no_stack_signal_come_from_its_beat_thread(tmp_path):
    # a started rank whose SIGUSR2 the script holds (or that could not take it) is not signalled: its
    # beat thread dumps every thread's stack when the ledger is asked for, and the driver reads that
    import threading

    from ddp_doctor.training.probes import child_beat
    from ddp_doctor.training.run.hung_children import _stacks
    pid = os.getpid()
    threading.Timer(0.3, child_beat._dump_stacks, args=(str(tmp_path),)).start()
    got = _stacks(str(tmp_path), {pid: {"pid": pid, "rank": 1, "stacks": False}})
    assert "Thread 0x" in got[pid] and "test_ledger_records.py" in got[pid], got
