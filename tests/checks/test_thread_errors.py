"""A thread of the script that died with an exception (checks/thread_errors.py, DDP815), from probe
records shaped as training/probes/recorder.py writes them, and the recorder's hook on a real thread."""
from __future__ import annotations

import threading

from ddp_doctor.checks.thread_errors import thread_errors
from ddp_doctor.training.probes.recorder import Recorder


def died(call: str | None = None, thread: str = "metrics", t: float = 5.0) -> dict:
    return {"thread": thread, "type": "RuntimeError", "message": "Connection closed by peer",
            "site": "train.py:40 in report", "call": call, "traceback": "Traceback ...", "t": t}


def test_a_thread_whose_collective_failed_is_an_error_when_nothing_else_failed():
    [f] = thread_errors({0: {"thread_errors": [died("all_reduce")]}, 1: {}}, failed=False)
    assert f.id == "DDP815" and f.severity == "error" and f.ranks == [0] and f.time == 5.0
    assert f.message == ("rank 0: thread 'metrics' died with RuntimeError: Connection closed by peer at "
                         "train.py:40 in report, inside torch.distributed.all_reduce; the script went on")
    # beside the job's own failure it is context, not a second cause
    [f] = thread_errors({0: {"thread_errors": [died("all_reduce")]}}, failed=True)
    assert f.severity == "warning"


def test_a_thread_that_died_outside_torch_distributed_is_a_warning_and_more_are_counted():
    [f] = thread_errors({1: {"thread_errors": [died(thread="uploader"), died(thread="other")]}}, failed=False)
    assert f.severity == "warning" and f.ranks == [1]
    assert "thread 'uploader' died with RuntimeError" in f.message and "(1 more thread(s) died too)" in f.message
    assert thread_errors({0: {}, 1: {"thread_errors": []}}, failed=False) == []


def test_the_recorder_keeps_what_ended_a_thread(tmp_path):
    rec = Recorder(str(tmp_path))
    seen = []

    def work():
        raise ValueError("no such bucket")

    def hook(args):
        rec.note_thread_error(args)
        seen.append(args.exc_type)

    old = threading.excepthook
    threading.excepthook = hook
    try:
        t = threading.Thread(target=work, name="uploader")
        t.start()
        t.join()
    finally:
        threading.excepthook = old
    assert seen == [ValueError]
    [e] = rec.to_dict()["thread_errors"]
    assert e["thread"] == "uploader" and e["type"] == "ValueError" and e["message"] == "no such bucket"
    assert e["site"].startswith(f"{__file__}:") and e["site"].endswith(" in work") and e["call"] is None
    assert "ValueError: no such bucket" in e["traceback"]
    assert list(tmp_path.glob("probe-*.json")), "written at once"


def test_os_exit_called_by_the_scripts_code_is_recorded_with_its_line(tmp_path, monkeypatch):
    from ddp_doctor.training.probes import install, recorder
    rec = Recorder(str(tmp_path))
    monkeypatch.setattr(recorder, "current_recorder", lambda: rec)
    exits: list = []
    fake_exit = install._os_exit(exits.append)  # the real os._exit would end the test
    fake_exit(0)
    line = test_os_exit_called_by_the_scripts_code_is_recorded_with_its_line.__code__.co_firstlineno + 6
    assert exits == [0]
    ended = rec.to_dict()["ended"]
    assert ended["how"] == "os_exit" and ended["status"] == 0 and ended["site"].startswith(f"{__file__}:{line}")
    assert list(tmp_path.glob("probe-*.json")), "written before the process ends"
    # called from a library's (or ddp-doctor's) code: not the script's own end
    other = Recorder(str(tmp_path / "other"))
    monkeypatch.setattr(recorder, "current_recorder", lambda: other)
    scope = {"f": fake_exit}
    exec(compile("def lib():\n    f(3)\n", install.__file__, "exec"), scope)
    scope["lib"]()
    assert exits == [0, 3] and other.ended is None
