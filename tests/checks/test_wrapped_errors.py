"""The real error inside a wrapped exception (ddp_doctor/checks/wrapped_errors.py): one test per
shape, on the text torch 2.13 / CPython 3.11 print (captured, paths shortened), and a signature
recognised inside a wrapper."""
from __future__ import annotations

import json
import traceback

import pytest

from ddp_doctor.checks.signatures import classify
from ddp_doctor.checks.wrapped_errors import Frame, error_file_text, parse_traceback, real_error

SITE = "/usr/lib/python3.11/site-packages"
TORCH = "/opt/torch"  # a library directory the caller names (not under site-packages)

WORKER_TB = f"""Traceback (most recent call last):
  File "{SITE}/torch/utils/data/_utils/worker.py", line 374, in _worker_loop
    data = fetcher.fetch(index)  # type: ignore[possibly-undefined]
           ^^^^^^^^^^^^^^^^^^^^
  File "{SITE}/torch/utils/data/_utils/fetch.py", line 54, in fetch
    data = [self.dataset[idx] for idx in possibly_batched_index]
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{SITE}/torch/utils/data/_utils/fetch.py", line 54, in <listcomp>
    data = [self.dataset[idx] for idx in possibly_batched_index]
            ~~~~~~~~~~~~^^^^^
  File "/work/train.py", line 7, in __getitem__
    raise ValueError("corrupt record 37")
ValueError: corrupt record 37
"""
# torch's ExceptionWrapper.reraise: the same type, the worker's traceback in the message
DL_MESSAGE = "Caught ValueError in DataLoader worker process 0.\nOriginal " + WORKER_TB
DL_TRACEBACK = f"""Traceback (most recent call last):
  File "/work/train.py", line 11, in <module>
    for b in DataLoader(D(), batch_size=1, num_workers=1):
  File "{SITE}/torch/utils/data/dataloader.py", line 1567, in _process_data
    data.reraise()
  File "{SITE}/torch/_utils.py", line 794, in reraise
    raise exception
ValueError: {DL_MESSAGE}
"""

SPAWN_MESSAGE = f"""

-- Process 1 terminated with the following error:
Traceback (most recent call last):
  File "{SITE}/torch/multiprocessing/spawn.py", line 87, in _wrap
    fn(i, *args)
  File "/work/sp.py", line 4, in w
    raise KeyError("LOCAL_RANK")
KeyError: 'LOCAL_RANK'
"""
SPAWN_TRACEBACK = f"""Traceback (most recent call last):
  File "/work/sp.py", line 7, in <module>
    mp.spawn(w, nprocs=2)
  File "{SITE}/torch/multiprocessing/spawn.py", line 211, in join
    raise ProcessRaisedException(msg, error_index, failed_process.pid)
torch.multiprocessing.spawn.ProcessRaisedException: {SPAWN_MESSAGE}"""

FUTURES_TRACEBACK = "concurrent.futures.process._RemoteTraceback: \n" + '''"""
Traceback (most recent call last):
  File "/usr/lib/python3.11/concurrent/futures/process.py", line 261, in _process_worker
    r = call_item.fn(*call_item.args, **call_item.kwargs)
        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/work/cf.py", line 4, in f
    raise OSError(f"disk gone at {x}")
OSError: disk gone at 3
"""

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/work/cf.py", line 8, in <module>
    ex.submit(f, 3).result()
  File "/usr/lib/python3.11/concurrent/futures/_base.py", line 401, in __get_result
    raise self._exception
OSError: disk gone at 3
'''

CAUSE_TRACEBACK = f"""Traceback (most recent call last):
  File "/work/train.py", line 20, in load
    return json.loads(text)
  File "/usr/lib/python3.11/json/__init__.py", line 346, in loads
    return _default_decoder.decode(s)
json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/work/train.py", line 30, in <module>
    cfg = load(path)
  File "{SITE}/somelib/config.py", line 9, in load
    raise RuntimeError("could not read the config")
RuntimeError: could not read the config
"""

CONTEXT_TRACEBACK = """Traceback (most recent call last):
  File "/work/cf.py", line 15, in <module>
    {}["x"]
    ~~^^^^^
KeyError: 'x'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/work/cf.py", line 17, in <module>
    raise RuntimeError("lookup failed")
RuntimeError: lookup failed
"""

# torchelastic's ChildFailedError summary as torch 2.13 formats it (the child's py_callstack
# indented by two spaces under "traceback :"; "·" stands for the trailing spaces torch leaves)
ELASTIC_MESSAGE = """
===================================================
train.py FAILED
---------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
---------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2023-11-14_22:13:20
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 123)·
  error_file: /tmp/torchelastic_x/error.json
  traceback : Traceback (most recent call last):
    File "/work/train.py", line 36, in <module>
      raise ValueError("corrupt record 37")
  ValueError: corrupt record 37
··
===================================================""".replace("·", " ")


def test_dataloader_worker_error_is_the_workers_own():
    real = real_error("ValueError", DL_MESSAGE, DL_TRACEBACK)
    assert real is not None
    assert real.summary == "ValueError: corrupt record 37"
    assert real.raised_at == Frame("/work/train.py", 7, "__getitem__")
    assert str(real.raised_at) == "/work/train.py:7 in __getitem__"
    (w,) = real.wrappers
    assert (w.kind, w.process, w.where) == ("dataloader_worker", 0, "in DataLoader worker process 0")
    assert real.wrapped_by == "ValueError: Caught ValueError in DataLoader worker process 0."
    assert real.traceback.startswith("Traceback (most recent call last):") and "corrupt record 37" in real.traceback


def test_spawned_process_error_names_the_process():
    real = real_error("ProcessRaisedException", SPAWN_MESSAGE, SPAWN_TRACEBACK)
    assert real is not None and real.summary == "KeyError: 'LOCAL_RANK'"
    assert real.spawn_process() == 1 and real.raised_at == Frame("/work/sp.py", 4, "w")
    assert real.wrapped_by == "ProcessRaisedException: -- Process 1 terminated with the following error:"


# Ray Train 2.x: trainer.fit() in the driver raises WorkerGroupError quoting each failed worker by rank
RAY_MESSAGE = """Training failed due to worker errors:
[Rank 1 Error Snippet]:
Traceback (most recent call last):
  File "/work/ray_train.py", line 13, in loop
    raise ValueError(f"boom from rank {rank} at step {step}")
ValueError: boom from rank 1 at step 2

[Rank 0 Error Snippet]:
Traceback (most recent call last):
  File "/work/ray_train.py", line 15, in loop
    dist.all_reduce(t)
RuntimeError: Connection closed by peer
"""
RAY_TRACEBACK = f"""Traceback (most recent call last):
  File "/work/ray_train.py", line 23, in <module>
    res = trainer.fit()
  File "{SITE}/ray/train/v2/api/data_parallel_trainer.py", line 195, in fit
    raise result.error
ray.train.WorkerGroupError: {RAY_MESSAGE}"""


def test_a_ray_train_workers_error_names_its_rank_and_line():
    real = real_error("ray.train.WorkerGroupError", RAY_MESSAGE, RAY_TRACEBACK)
    assert real is not None and real.summary == "ValueError: boom from rank 1 at step 2"
    assert real.ray_rank() == 1 and real.spawn_process() is None
    assert real.raised_at == Frame("/work/ray_train.py", 13, "loop")  # the worker's line, not fit()'s
    (w,) = real.wrappers
    assert (w.kind, w.where) == ("ray_worker", "in Ray Train worker rank 1")


def test_a_ray_train_workers_error_is_that_ranks_finding():
    from ddp_doctor.checks import load_catalogue
    from ddp_doctor.checks.rank_endings import exception_finding
    load_catalogue()
    f = exception_finding(0, {"type": "ray.train.WorkerGroupError", "message": RAY_MESSAGE,
                              "traceback": RAY_TRACEBACK})
    assert (f.id, f.ranks, f.kind) == ("DDP800", [1], ("code", "fix_code"))
    assert f.message.startswith("rank 1 raised ValueError: boom from rank 1 at step 2 at /work/ray_train.py:13")
    assert f.evidence["raised_at"] == "/work/ray_train.py:13 in loop" and f.evidence["ray_worker_rank"] == 1


def test_process_pool_error_is_found_in_its_remote_traceback():
    real = real_error("OSError", "disk gone at 3", FUTURES_TRACEBACK)
    assert real is not None and real.summary == "OSError: disk gone at 3"
    assert real.raised_at == Frame("/work/cf.py", 4, "f")  # in the worker, not the parent's .result()
    (w,) = real.wrappers
    assert w.kind == "remote" and w.by == "OSError: disk gone at 3"


def test_the_innermost_direct_cause_is_the_real_error():
    real = real_error("RuntimeError", "could not read the config", CAUSE_TRACEBACK)
    assert real is not None and real.summary == "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"
    assert real.raised_at == Frame("/work/train.py", 20, "load")  # json's own frame is a library's
    (w,) = real.wrappers
    assert w.kind == "cause" and w.by == "RuntimeError: could not read the config"


def test_an_error_raised_while_handling_another_is_its_own_error():
    # `try: cache[k] except KeyError: compute(k)` where compute raises: the KeyError it handled is
    # no cause of it; only `raise ... from` wraps
    assert real_error("RuntimeError", "lookup failed", CONTEXT_TRACEBACK) is None


def test_torchelastic_child_failure_is_the_childs_error():
    real = real_error("ChildFailedError", ELASTIC_MESSAGE, "")
    assert real is not None and real.summary == "ValueError: corrupt record 37"
    assert real.raised_at == Frame("/work/train.py", 36, "<module>")
    (w,) = real.wrappers
    assert (w.kind, w.process, w.by) == ("torchelastic", 1, "ChildFailedError: train.py FAILED")


def test_torchelastic_summary_as_this_torch_formats_it(tmp_path):
    """The summary format is torch's: build a ChildFailedError from an error file in torch's shape."""
    errors = pytest.importorskip("torch.distributed.elastic.multiprocessing.errors")
    try:
        raise ValueError("corrupt record 37")
    except ValueError as e:
        data = {"message": {"message": f"ValueError: {e}",
                            "extraInfo": {"py_callstack": traceback.format_exc(), "timestamp": "1700000000"}}}
    path = tmp_path / "error.json"
    path.write_text(json.dumps(data))
    failure = errors.ProcessFailure(local_rank=1, pid=123, exitcode=1, error_file=str(path))
    exc = errors.ChildFailedError("train.py", {3: failure})
    real = real_error(type(exc).__name__, str(exc), "")
    assert real is not None and real.summary == "ValueError: corrupt record 37"
    assert real.raised_at is not None and real.raised_at.file == __file__
    assert real.wrappers[0].process == 3


def test_torchelastic_error_file_text():
    stack = ('Traceback (most recent call last):\n  File "/work/t.py", line 2, in <module>\n    f()\n'
             "KeyError: 'RANK'\n")
    data = {"message": {"message": "KeyError: 'RANK'", "extraInfo": {"py_callstack": stack, "timestamp": "1"}}}
    assert error_file_text(data) == stack and error_file_text(json.dumps(data)) == stack
    assert error_file_text({"message": {"message": "KeyError: 'RANK'"}}) == "KeyError: 'RANK'"
    real = real_error("ChildFailedError", json.dumps(data))
    assert real is not None and real.summary == "KeyError: 'RANK'" and real.raised_at == Frame("/work/t.py", 2,
                                                                                                "<module>")


def test_a_worker_error_inside_a_spawned_process_is_unwrapped_to_the_worker():
    message = ("\n\n-- Process 0 terminated with the following error:\nTraceback (most recent call last):\n"
               f'  File "/work/sp.py", line 9, in w\n    next(it)\nValueError: {DL_MESSAGE}')
    real = real_error("ProcessRaisedException", message, "")
    assert real is not None and real.summary == "ValueError: corrupt record 37"
    assert [w.kind for w in real.wrappers] == ["spawn", "dataloader_worker"]
    assert real.describe_wrapping(skip=("spawn",)) == "in DataLoader worker process 0"


@pytest.mark.parametrize("type_,message,tb", [
    ("ValueError", "bad batch", 'Traceback (most recent call last):\n  File "/w/t.py", line 3, in <module>\n'
                                "ValueError: bad batch\n"),
    ("ProcessExitedException", "process 1 terminated with exit code 1", ""),
    ("RuntimeError", "Caught nothing", ""),
])
def test_an_error_that_wraps_nothing_is_none(type_, message, tb):
    assert real_error(type_, message, tb) is None


def test_library_frames_are_never_the_users_line():
    tb = (f'Traceback (most recent call last):\n  File "/work/train.py", line 5, in step\n    x.view(3)\n'
          f'  File "{TORCH}/tensor.py", line 10, in view\n    raise RuntimeError("shape")\nRuntimeError: shape\n')
    message = "Caught RuntimeError in DataLoader worker process 2.\nOriginal " + tb
    real = real_error("RuntimeError", message, "", library_dirs=(TORCH,))
    assert real is not None and real.raised_at == Frame("/work/train.py", 5, "step")
    assert real_error("RuntimeError", message, "").raised_at == Frame(f"{TORCH}/tensor.py", 10, "view")
    only_torch = tb.replace('"/work/train.py"', f'"{SITE}/x.py"')
    assert real_error("RuntimeError", "Caught RuntimeError in DataLoader worker process 2.\nOriginal " + only_torch,
                      "", library_dirs=(TORCH,)).raised_at is None


def test_parse_traceback_keeps_a_message_on_several_lines():
    err = parse_traceback('Traceback (most recent call last):\n  File "/w/a.py", line 1, in <module>\n'
                          "RuntimeError: first\nsecond line\n")
    assert err is not None and (err.type, err.message) == ("RuntimeError", "first\nsecond line")
    assert parse_traceback("no exception here at all") is None


def test_a_known_signature_inside_a_wrapper_is_recognised():
    shm = (f'Traceback (most recent call last):\n  File "{SITE}/torch/storage.py", line 414, in _new_shared\n'
           "    return cls._new_using_fd_cpu(size)\nRuntimeError: unable to allocate shared memory(shm) for file "
           "</torch_21440_668148441_0>: No space left on device (28)\n")
    real = real_error("RuntimeError", "Caught RuntimeError in DataLoader worker process 0.\nOriginal " + shm, "")
    assert real is not None and classify(real.text()).entry.id == "DDP827"
    cause = real_error("RuntimeError", "step failed",
                       "Traceback (most recent call last):\nRuntimeError: [../third_party/gloo/gloo/transport/tcp/"
                       "pair.cc:534] Connection closed by peer [10.0.0.2]:40312\n\nThe above exception was the "
                       "direct cause of the following exception:\n\nTraceback (most recent call last):\n"
                       '  File "/w/t.py", line 9, in <module>\nRuntimeError: step failed\n')
    assert cause is not None and classify(cause.text()).entry.id == "DDP826"


@pytest.mark.parametrize("message", ['{"message": "bad"}', '{"message": {"message": "bad"}}', "not json {"])
def test_json_that_is_no_error_file_wraps_nothing(message):
    assert real_error("ValueError", message, "") is None


def test_user_frame_is_the_innermost_user_line_of_the_exception_that_ended_the_script():
    from ddp_doctor.checks.wrapped_errors import user_frame
    tb = ('Traceback (most recent call last):\n  File "/u/train.py", line 3, in <module>\n    load()\n'
          '  File "/u/train.py", line 9, in load\n    open(p)\nFileNotFoundError: x\n\n'
          'During handling of the above exception, another exception occurred:\n\n'
          'Traceback (most recent call last):\n  File "/u/train.py", line 5, in <module>\n    step()\n'
          '  File "/u/lib/site-packages/torch/distributed/c10d.py", line 80, in all_reduce\n    work.wait()\n'
          'RuntimeError: Connection closed by peer\n')
    assert str(user_frame(tb)) == "/u/train.py:5 in <module>"  # the last exception's, past the library frame
    assert user_frame("no traceback here") is None
