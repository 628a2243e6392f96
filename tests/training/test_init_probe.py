"""The init_process_group recorder (training/probes/init_calls.py): the values exactly as
passed, the source text of each argument at the call, and which torch.multiprocessing.spawn
started the process."""
from __future__ import annotations

import json
import os

from ddp_doctor.training.probes import init_calls as probe

SOURCE = '''import torch.distributed as dist

def setup(rank, training_args):
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{PORT}",
        rank=rank + 1,
        world_size=training_args.n_gpu)
    dist.init_process_group("gloo", "env://", None, len(GPUS), r)
    other_call(world_size=3)
'''


def lines_of(text):
    return lambda _path: text.splitlines(keepends=True)


def test_argument_texts_are_read_at_any_line_of_a_call_over_several_lines():
    for line in (4, 6, 7):
        texts = probe.argument_texts(f"train.py:{line}", lines_of(SOURCE))
        assert texts == {"init_method": 'f"tcp://127.0.0.1:{PORT}"', "rank": "rank + 1",
                         "world_size": "training_args.n_gpu"}


def test_positional_arguments_and_calls_that_are_not_init():
    assert probe.argument_texts("train.py:8", lines_of(SOURCE)) == {
        "init_method": '"env://"', "world_size": "len(GPUS)", "rank": "r"}
    assert probe.argument_texts("train.py:9", lines_of(SOURCE)) == {}
    assert probe.argument_texts("train.py:1", lines_of("def broken(:\n")) == {}
    assert probe.argument_texts(None) == {}


def test_the_record_keeps_a_world_size_of_zero_as_passed(monkeypatch):
    monkeypatch.delenv(probe.SPAWN_ENV, raising=False)
    rec = probe.call_record(("gloo",), {"init_method": "tcp://127.0.0.1:1", "rank": 1, "world_size": 0})
    assert rec["world_size_passed"] == 0 and rec["world_size_arg"] is None  # the usable value: none
    assert rec["rank_passed"] == 1 and rec["rank_arg"] == 1
    assert "spawn" not in rec and rec["ppid"] == os.getppid()
    rec = probe.call_record(("gloo",), {})
    assert rec["world_size_passed"] is None and rec["rank_passed"] is None
    assert probe.call_record(("gloo", None, None, -1, -1), {})["world_size_passed"] == -1


def test_the_record_names_the_call_site_and_the_argument_texts_there(monkeypatch):
    monkeypatch.delenv(probe.SPAWN_ENV, raising=False)
    # the wrapper runs inside ddp-doctor's own code, so the site is the user's line that called init:
    # here a function named init_process_group compiled as if it were ddp-doctor's
    scope = {"record": probe.call_record}
    code = compile("def init_process_group(*a, **k):\n    return record(a, k)\n",
                   os.path.join(os.path.dirname(probe.__file__), "fake_wrapper.py"), "exec")
    exec(code, scope)
    init_process_group = scope["init_process_group"]
    n_gpu = 0
    rec = init_process_group("gloo", rank=0, world_size=n_gpu)
    path, _, line = rec["site"].rpartition(":")
    assert path == __file__ and int(line) > 0
    assert rec["arg_text"] == {"rank": "0", "world_size": "n_gpu"}
    assert rec["world_size_passed"] == 0


def test_the_spawn_wrapper_tells_its_children_who_started_them(monkeypatch):
    monkeypatch.delenv(probe.SPAWN_ENV, raising=False)
    seen = {}

    def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        seen.update(json.loads(os.environ[probe.SPAWN_ENV]))
        return "context"

    wrapped = probe.spawn_wrapper(start_processes)
    assert wrapped(print, (), 3, True, False, start_method="spawn") == "context"
    assert seen["parent"] == os.getpid() and seen["nprocs"] == 3
    assert probe.SPAWN_ENV not in os.environ  # restored once the processes were started


def test_a_child_reads_its_spawn_only_when_its_parent_set_it(monkeypatch):
    monkeypatch.setenv(probe.SPAWN_ENV, json.dumps({"parent": os.getppid(), "nprocs": 2, "site": "x.py:3"}))

    def _wrap(fn, i, args, error_file):  # noqa: ARG001 - the frame torch.multiprocessing.spawn runs children in
        return probe.spawn_of_this_process()

    _wrap.__code__ = _wrap.__code__.replace(co_filename=os.path.join("torch", "multiprocessing", "spawn.py"))
    assert _wrap(None, 1, (), "") == {"parent": os.getppid(), "nprocs": 2, "site": "x.py:3", "index": 1}
    monkeypatch.setenv(probe.SPAWN_ENV, json.dumps({"parent": -5, "nprocs": 2}))  # a grandparent's
    assert probe.spawn_of_this_process() is None


def test_an_init_call_names_its_job_and_another_jobs_call_is_not_read(tmp_path):
    """Hand-started ranks of two jobs on the same port share a run directory: the first job's
    init calls (a duplicate rank, say) must never be judged as the second job's."""
    from ddp_doctor.training import records
    from ddp_doctor.training.probes.init_calls import call_record
    try:
        records.join_job("job-a")
        first = call_record((), {"backend": "gloo", "rank": 0, "world_size": 2})
        assert first[records.JOB_FIELD] == "job-a"
        records.write_json(records.init_call_path(str(tmp_path), 101), first)
        records.join_job("job-b")
        second = call_record((), {"backend": "gloo"})
        records.write_json(records.init_call_path(str(tmp_path), 102), second)
        records.write_json(records.init_call_path(str(tmp_path), 103),
                           {**{k: v for k, v in second.items() if k != records.JOB_FIELD}, "pid": 103})
        read = records.read_init_calls(str(tmp_path))
        assert sorted(r["pid"] for r in read) == sorted([second["pid"], 103])  # job-a's left out, an untokened kept
    finally:
        records.join_job(None)


def test_the_record_says_where_the_script_set_a_rendezvous_variable(monkeypatch):
    monkeypatch.delenv(probe.SPAWN_ENV, raising=False)
    monkeypatch.setenv("MASTER_PORT", "29500")  # put back by monkeypatch at the end
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setattr(probe, "_env_writes", {})
    environ = type(os.environ)
    monkeypatch.setattr(environ, "__setitem__", probe.env_write_wrapper(environ.__setitem__))
    os.environ["MASTER_PORT"] = "23999"
    line = test_the_record_says_where_the_script_set_a_rendezvous_variable.__code__.co_firstlineno + 7
    os.environ.update(MASTER_ADDR="10.0.0.1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    rec = probe.call_record(("gloo",), {})
    assert rec["env"]["MASTER_PORT"] == "23999"
    assert rec["env_set_at"] == {"MASTER_PORT": f"{__file__}:{line}", "MASTER_ADDR": f"{__file__}:{line + 2}"}
    del os.environ["MASTER_ADDR"]  # no longer the value written there: not said
    assert probe.env_set_sites() == {"MASTER_PORT": f"{__file__}:{line}"}
    assert os.environb.get(b"MASTER_PORT") == b"23999"  # the bytes view is not recorded, nor broken
