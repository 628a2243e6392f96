"""NCCL flight recorder dumps read as ledgers (training/run/nccl_dumps.py), without a GPU: pickles
shaped as torch's NCCL watchdog writes them on a timeout (one file per rank, PREFIX + rank;
unpickled: {"version", "pg_config", "pg_status", "entries": [...]}, process_group a tuple, state
"scheduled" | "started" | "completed"), through the same alignment (checks/collectives.py) and
`with_ledgers` as the gloo ledgers."""
from __future__ import annotations

import json
import os
import pickle
import signal
from typing import Any

from ddp_doctor.checks.causes import with_ledgers
from ddp_doctor.checks.collectives import is_pending, ledger_findings
from ddp_doctor.checks.rank_endings import training_findings
from ddp_doctor.facts.own_env import OWN_ENV
from ddp_doctor.report import build as reportlib
from ddp_doctor.training import records
from ddp_doctor.training.run import ledger, nccl_dumps

T0 = 1795418264335696816
SCRIPT = "/home/user/train.py"


def frames(line: int) -> list[dict[str, Any]]:
    lib = "/usr/lib/python3/site-packages/torch/distributed"
    return [{"name": "all_reduce", "filename": f"{lib}/distributed_c10d.py", "line": 2696},
            {"name": "wrapper", "filename": f"{lib}/c10d_logger.py", "line": 83},
            {"name": "<module>", "filename": SCRIPT, "line": line}]


def nccl_entry(seq: int, sizes: list[list[int]], state: str = "completed", *, retired: bool | None = None,
               line: int = 10, record: int | None = None, created: int | None = None,
               pg: tuple[str, str] = ("0", "default_pg"), op: str = "all_reduce") -> dict[str, Any]:
    done = state == "completed"
    return {"frames": frames(line), "record_id": seq - 1 if record is None else record, "pg_id": int(pg[0]),
            "process_group": pg, "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": f"nccl:{op}", "time_created_ns": T0 + seq * 1000 if created is None else created,
            "input_sizes": sizes, "input_dtypes": ["Float"] * len(sizes), "output_sizes": sizes,
            "output_dtypes": ["Float"] * len(sizes), "state": state,
            "time_discovered_started_ns": None, "time_discovered_completed_ns": T0 + seq * 1000 + 500 if done else None,
            "retired": done if retired is None else retired, "timeout_ms": 10000, "is_p2p": False}


def dump_data(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": {"0": {"last_enqueued_collective": len(entries), "last_started_collective": -1,
                                "last_completed_collective": 1}},
            "entries": entries}


def write_dump(run_dir: str, rank: int, entries: list[dict[str, Any]], when: float | None = None) -> str:
    path = nccl_dumps.dump_prefix(run_dir) + str(rank)
    with open(path, "wb") as f:
        pickle.dump(dump_data(entries), f, protocol=2)  # torch's C++ pickler writes protocol 2
    if when is not None:
        os.utime(path, (when, when))
    return path


def aborted(ranks: list[int]) -> list[Any]:
    """What the launcher's exit statuses give when NCCL's watchdog aborted these ranks."""
    found, _ = training_findings({}, {r: -signal.SIGABRT for r in ranks}, ranks)
    return found


# ------------------------------------------------------------------------------------ environment

def test_recorder_env_points_nccl_dumps_into_the_run_directory(tmp_path):
    env: dict[str, str] = {}
    ledger.recorder_env(env, str(tmp_path))
    prefix = os.path.join(str(tmp_path), "nccl-fr-rank-")
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000"
    env = {}
    ledger.recorder_env(env)  # no run directory: the buffer only, as before
    assert "TORCH_FR_DUMP_TEMP_FILE" not in env and "TORCH_NCCL_DUMP_ON_TIMEOUT" not in env


def test_recorder_env_sets_the_older_buffer_name_only_for_older_torch(monkeypatch):
    monkeypatch.setattr(nccl_dumps, "torch_before", lambda major, minor: True)
    env: dict[str, str] = {}
    ledger.recorder_env(env)
    assert env == {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
                   OWN_ENV: "TORCH_FR_BUFFER_SIZE,TORCH_NCCL_TRACE_BUFFER_SIZE"}  # marked as ddp-doctor's
    monkeypatch.setattr(nccl_dumps, "torch_before", lambda major, minor: False)
    env = {}
    ledger.recorder_env(env)
    assert env == {"TORCH_FR_BUFFER_SIZE": "2000", OWN_ENV: "TORCH_FR_BUFFER_SIZE"}


def test_recorder_env_never_overrides_the_users_dump_settings(tmp_path):
    d = str(tmp_path)
    env = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/trace_", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
           "TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}
    mine = dict(env)
    ledger.recorder_env(env, d)
    assert {k: env[k] for k in mine} == mine  # the user's values stand
    assert not {"TORCH_FR_DUMP_TEMP_FILE", "TORCH_FR_BUFFER_SIZE"} & set(env)  # nothing moved around them
    env = {"TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr_"}
    ledger.recorder_env(env, d)
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/scratch/fr_" and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env
    env = {"TORCH_FR_DUMP_DYNAMIC_FILE_NAME": "1"}  # torch then writes to the exact value: the user's names
    ledger.recorder_env(env, d)
    assert "TORCH_FR_DUMP_TEMP_FILE" not in env and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env


def test_recorder_env_works_on_os_environ(tmp_path, monkeypatch):
    names = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
             "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_DYNAMIC_FILE_NAME",
             "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "TORCH_NCCL_ENABLE_MONITORING",
             "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "TORCH_NCCL_ASYNC_ERROR_HANDLING", OWN_ENV)
    for name in names:
        monkeypatch.delenv(name, raising=False)  # restored afterwards where they were set
    try:
        ledger.recorder_env(os.environ, str(tmp_path))  # a rank under an outside launcher
        assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == nccl_dumps.dump_prefix(str(tmp_path))
        assert os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    finally:
        for name in names:
            os.environ.pop(name, None)


# ------------------------------------------------------------------------------------ reading safely

def test_the_restricted_unpickler_refuses_code_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    evil = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    (tmp_path / "nccl-fr-rank-0").write_bytes(evil)
    builtins_eval = b"cbuiltins\neval\n(S'1+1'\ntR."
    (tmp_path / "nccl-fr-rank-1").write_bytes(builtins_eval)
    assert nccl_dumps.load(str(tmp_path / "nccl-fr-rank-0")) is None
    assert nccl_dumps.load(str(tmp_path / "nccl-fr-rank-1")) is None
    assert nccl_dumps.read_dumps(str(tmp_path)) == {}
    assert not marker.exists()


CALLED: list[str] = []


def _record_call(arg: str) -> str:
    CALLED.append(arg)
    return arg


def test_a_global_that_plain_pickle_would_call_is_refused(tmp_path):
    payload = f"c{__name__}\n_record_call\n(S'ran'\ntR.".encode()
    assert pickle.loads(payload) == "ran" and CALLED == ["ran"]  # what an unrestricted load does
    CALLED.clear()
    (tmp_path / "nccl-fr-rank-0").write_bytes(payload)
    assert nccl_dumps.read_dumps(str(tmp_path)) == {} and CALLED == []


def test_junk_files_are_skipped_and_reading_never_raises(tmp_path):
    d = str(tmp_path)
    good = write_dump(d, 0, [nccl_entry(1, [[3]])])
    (tmp_path / "nccl-fr-rank-1").write_bytes(b"")
    (tmp_path / "nccl-fr-rank-2").write_bytes(os.urandom(64))
    (tmp_path / "nccl-fr-rank-3").write_bytes(pickle.dumps(dump_data([nccl_entry(1, [[3]])]), protocol=2)[:40])
    (tmp_path / "nccl-fr-rank-4").write_bytes(pickle.dumps([1, 2, 3], protocol=2))  # not a dump
    (tmp_path / "nccl-fr-rank-5.tmp").write_bytes(open(good, "rb").read())  # not a rank's file name
    (tmp_path / "nccl-fr-rank-x").write_bytes(open(good, "rb").read())
    os.mkdir(tmp_path / "nccl-fr-rank-6")
    got = nccl_dumps.read_dumps(d)
    assert sorted(got) == [0]
    assert nccl_dumps.read_dumps(str(tmp_path / "missing")) == {}


def test_a_dump_reads_as_a_ledger_of_the_same_shape(tmp_path):
    d = str(tmp_path)
    path = write_dump(d, 1, [nccl_entry(1, [[3, 4]]), nccl_entry(2, [[3, 4]], "scheduled")], when=1795418300.0)
    got = nccl_dumps.read_dumps(d)[1]
    assert (got["rank"], got["source"], got["position"], got["time"], got["path"]) == \
        (1, "nccl_dump", "hung", 1795418300.0, path)
    assert got["entries"][0]["process_group"] == ["0", "default_pg"]  # tuples read as JSON lists
    assert got["pg_config"]["0"]["desc"] == "default_pg" and got["complete"] is True
    json.dumps(got)  # plain data, like ledger-RANK.json


def test_a_json_dump_is_read_too(tmp_path):
    (tmp_path / "nccl-fr-rank-0").write_text(json.dumps(dump_data([nccl_entry(1, [[2]])])))
    assert nccl_dumps.read_dumps(str(tmp_path))[0]["entries"][0]["collective_seq_id"] == 1


def test_entries_before_the_script_are_left_out(tmp_path):
    d = str(tmp_path)
    preflight = [nccl_entry(s, [[1]], record=s - 1, created=T0 - 10_000 + s) for s in (1, 2, 3)]
    script = [nccl_entry(1, [[5]], record=3), nccl_entry(2, [[5]], "started", record=4)]
    write_dump(d, 0, preflight + script)
    write_dump(d, 1, preflight + script[:1])
    # rank 0 has its own ledger (the script's start); rank 1 was aborted before writing one
    own = {0: {"rank": 0, "time": 1.0, "since_ns": T0, "entries": [], "position": "running"}}
    got = nccl_dumps.read_dumps(d, own)
    assert [e["input_sizes"] for e in got[0]["entries"]] == [[[5]], [[5]]]
    assert [e["input_sizes"] for e in got[1]["entries"]] == [[[5]]]  # the others' start bounds it
    alone = nccl_dumps.read_dumps(d)  # no start known: the latest incarnation of each group
    assert [e["collective_seq_id"] for e in alone[0]["entries"]] == [1, 2]
    assert [e["input_sizes"] for e in alone[1]["entries"]] == [[[5]]]


# ------------------------------------------------------------------------------------ pending

def test_pending_knows_nccls_completion_and_keeps_gloos():
    gloo = {"profiling_name": "gloo:all_reduce", "state": "scheduled"}
    assert is_pending({**gloo, "retired": False}) and not is_pending({**gloo, "retired": True})
    assert is_pending({**gloo, "retired": True, "failed_here": True})
    assert not is_pending(nccl_entry(1, [[1]], "completed", retired=False))  # done, not yet retired
    assert is_pending(nccl_entry(1, [[1]], "scheduled")) and is_pending(nccl_entry(1, [[1]], "started"))
    assert not is_pending(nccl_entry(1, [[1]], "scheduled", retired=True))  # retired: as gloo's


# ------------------------------------------------------------------------------------ alignment

def test_mismatched_all_reduce_from_the_dumps_is_the_cause_and_the_aborts_are_consequences(tmp_path):
    d = str(tmp_path)
    # the tutorial's crash.py: rank 0 issues an extra all_reduce of a [4, 5] tensor; rank 1's next
    # all_reduce ([3, 4]) meets it as call #3; NCCL's watchdog times out, dumps, aborts both
    common = [nccl_entry(1, [[3, 4]], line=20), nccl_entry(2, [[3, 4]], line=20)]
    p0 = write_dump(d, 0, common + [nccl_entry(3, [[4, 5]], "scheduled", line=25),
                                    nccl_entry(4, [[3, 4]], "scheduled", line=28)])
    p1 = write_dump(d, 1, common + [nccl_entry(3, [[3, 4]], "started", line=28),
                                    nccl_entry(4, [[3, 4]], "scheduled", line=28)])
    ledgers = nccl_dumps.merged(d, records.read_ledgers(d))
    found = ledger_findings(ledgers)
    assert [f.id for f in found] == ["DDP890"]
    assert "call #3" in found[0].message and "float[4, 5]" in found[0].message.lower() \
        and "train.py:25" in found[0].message
    out = with_ledgers(aborted([0, 1]), ledgers, world_size=2)
    crashes = [f for f in out if f.id == "DDP807"]
    assert len(crashes) == 2 and all(f.caused_by is not None for f in crashes)
    assert {f.evidence["nccl_dump"] for f in crashes} == {p0, p1}
    rep = reportlib.build_report(world={}, ranks=[], findings=out, phase="training")
    assert rep["root_cause"]["id"] == "DDP890"
    assert rep["root_cause"]["evidence"]["nccl_dumps"] == {"0": p0, "1": p1}


def test_a_rank_elsewhere_from_the_dumps(tmp_path):
    d = str(tmp_path)
    # rank 0 waits in all_reduce #3; rank 1 completed #2 and is elsewhere (its heartbeat says where)
    write_dump(d, 0, [nccl_entry(1, [[8]]), nccl_entry(2, [[8]]), nccl_entry(3, [[8]], "started", line=31)])
    write_dump(d, 1, [nccl_entry(1, [[8]]), nccl_entry(2, [[8]])])
    records.write_heartbeat(d, 1, {"phase": "training", "where": f"{SCRIPT}:40 in <module>", "steps": 2})
    ledgers = nccl_dumps.merged(d, {})
    found = ledger_findings(ledgers)
    assert [f.id for f in found] == ["DDP891"] and found[0].ranks == [1]
    assert "all_reduce #3" in found[0].message and f"{SCRIPT}:40" in found[0].message
    # rank 0 aborted by NCCL's watchdog, rank 1 stopped by the launcher afterwards
    before, _ = training_findings({}, {0: -signal.SIGABRT, 1: -signal.SIGTERM}, [0, 1])
    out = with_ledgers(before, ledgers, world_size=2)
    assert all(f.caused_by is not None for f in out if f.id != "DDP891")
    rep = reportlib.build_report(world={}, ranks=[], findings=out, phase="training")
    assert rep["root_cause"]["id"] == "DDP891" and rep["root_cause"]["ranks"] == [1]


def test_an_aborted_rank_is_read_from_its_dump_next_to_the_others_ledgers(tmp_path):
    d = str(tmp_path)
    # rank 0 failed in Python and wrote its ledger; rank 1 was aborted (SIGABRT) before writing its
    # own: only its dump says it waited in all_reduce #2 while rank 0 had issued a broadcast there
    records.write_ledger(d, 0, {"source": "flight_recorder", "position": "failed", "since_ns": T0,
                                "entries": [nccl_entry(1, [[4]]), nccl_entry(2, [[4]], "scheduled", op="broadcast")]})
    write_dump(d, 1, [nccl_entry(1, [[4]]), nccl_entry(2, [[4]], "scheduled")])
    ledgers = nccl_dumps.merged(d, records.read_ledgers(d))
    assert ledgers[0]["source"] == "flight_recorder" and ledgers[1]["source"] == "nccl_dump"
    found = ledger_findings(ledgers)
    # rank 0's broadcast is a call no rank had issued; rank 1's all_reduce is the routine one
    assert [f.id for f in found] == ["DDP893"] and found[0].ranks == [0] and "broadcast" in found[0].message


def test_for_a_rank_with_both_the_newer_is_kept(tmp_path):
    d = str(tmp_path)
    records.write_ledger(d, 0, {"source": "flight_recorder", "position": "hung", "entries": []})
    led_time = records.read_ledgers(d)[0]["time"]
    write_dump(d, 0, [nccl_entry(1, [[1]])], when=led_time - 10)
    assert nccl_dumps.merged(d, records.read_ledgers(d))[0]["source"] == "flight_recorder"
    write_dump(d, 0, [nccl_entry(1, [[1]])], when=led_time + 10)
    assert nccl_dumps.merged(d, records.read_ledgers(d))[0]["source"] == "nccl_dump"


def test_a_sigabrt_not_waiting_in_the_faulty_collective_stays_a_cause(tmp_path):
    d = str(tmp_path)
    write_dump(d, 0, [nccl_entry(1, [[8]]), nccl_entry(2, [[8]], "started")])
    write_dump(d, 1, [nccl_entry(1, [[8]])])
    out = with_ledgers(aborted([1]), nccl_dumps.merged(d, {}), world_size=2)
    crash = next(f for f in out if f.id == "DDP807")
    assert crash.caused_by is None  # rank 1 was elsewhere: its abort is its own


def test_nccls_own_aids_are_turned_on_for_the_ranks_unless_the_user_set_them(tmp_path):
    from ddp_doctor.training.run.nccl_dumps import aids_env
    env: dict[str, str] = {}
    aids_env(env, str(tmp_path))
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert env["NCCL_DEBUG_FILE"] == str(tmp_path / "nccl-debug.%h.%p.log")  # not the user's output
    assert env["TORCH_NCCL_ENABLE_MONITORING"] == "1" and env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "480"
    mine = {"NCCL_DEBUG": "WARN", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "60", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    env = dict(mine)
    aids_env(env, str(tmp_path))
    assert {k: env[k] for k in mine} == mine and "NCCL_DEBUG_FILE" not in env
