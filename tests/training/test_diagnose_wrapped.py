"""Wrapped errors in the diagnosis (ddp_doctor/checks/rank_endings.py): a wrapped exception is shown by
its real error; the same error on several ranks, but for each rank's own numbers, is one cause
raised on each, not a rank failing after another."""
from __future__ import annotations

from ddp_doctor.checks.rank_endings import exception_finding, same_error_modulo_rank, training_findings
from ddp_doctor.report.build import build_report

SITE = "/usr/lib/python3.11/site-packages"
WORKER_TB = f"""Traceback (most recent call last):
  File "{SITE}/torch/utils/data/_utils/worker.py", line 374, in _worker_loop
    data = fetcher.fetch(index)  # type: ignore[possibly-undefined]
  File "{SITE}/torch/utils/data/_utils/fetch.py", line 54, in <listcomp>
    data = [self.dataset[idx] for idx in possibly_batched_index]
            ~~~~~~~~~~~~^^^^^
  File "/work/train.py", line 7, in __getitem__
    raise ValueError("corrupt record 37")
ValueError: corrupt record 37
"""
DL_MESSAGE = "Caught ValueError in DataLoader worker process 0.\nOriginal " + WORKER_TB
GLOO_CLOSED = ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
               "[127.0.0.1]:40312")


def exc(t: float, type_: str = "ValueError", message: str = "bad batch", tb: str | None = None) -> dict:
    return {"type": type_, "message": message, "time": t,
            "traceback": tb if tb is not None else f"Traceback...\n{type_}: {message}\n"}


def outcome(exception: dict, code: int = 1) -> dict:
    return {"exit_code": code, "exception": exception, "time": 100.0}


def dl_exc(t: float) -> dict:
    return exc(t, "ValueError", DL_MESSAGE, f"Traceback (most recent call last):\n  File \"{SITE}/torch/_utils.py\", "
                                            f"line 794, in reraise\n    raise exception\nValueError: {DL_MESSAGE}")


# ------------------------------------------------------------------------------------ A: real error

def test_a_dataloader_workers_error_is_shown_as_its_own_with_the_users_line():
    f = exception_finding(1, dl_exc(10.0))
    assert f.id == "DDP800" and f.ranks == [1]
    assert f.message == ("rank 1 raised ValueError: corrupt record 37 at /work/train.py:7 in __getitem__ "
                         "(in DataLoader worker process 0)")
    assert "Original Traceback" not in f.message
    assert f.evidence["wrapped_by"] == "ValueError: Caught ValueError in DataLoader worker process 0."
    assert f.evidence["raised_at"] == "/work/train.py:7 in __getitem__"
    assert f.evidence["wrapping"][0]["kind"] == "dataloader_worker"


def test_the_wrapped_error_on_rank_1_is_the_root_cause_and_rank_0s_lost_peer_its_consequence():
    outcomes = {1: outcome(dl_exc(10.0)), 0: outcome(exc(11.0, "RuntimeError", GLOO_CLOSED))}
    findings, code = training_findings(outcomes, {0: 1, 1: 1}, [0, 1])
    rep = build_report(world={}, ranks=[], findings=findings, phase="training")
    cause = rep["root_cause"]
    assert cause["id"] == "DDP800" and cause["ranks"] == [1], rep["findings"]
    assert "ValueError: corrupt record 37 at /work/train.py:7" in cause["message"]
    peer = [f for f in rep["findings"] if f["id"] == "DDP802"]
    assert peer and peer[0]["ranks"] == [0] and code == 1


def test_a_known_signature_inside_a_wrapper_gets_its_own_finding():
    shm = WORKER_TB.replace("ValueError: corrupt record 37", "RuntimeError: unable to allocate shared memory(shm) "
                            "for file </torch_21440_668148441_0>: No space left on device (28)")
    message = "Caught RuntimeError in DataLoader worker process 0.\nOriginal " + shm
    f = exception_finding(0, exc(1.0, "RuntimeError", message, ""))
    assert f.id == "DDP827" and "unable to allocate shared memory" in f.message
    assert "/work/train.py:7 in __getitem__" in f.message


def test_a_spawned_childs_error_names_the_process_and_its_line():
    message = ("\n\n-- Process 1 terminated with the following error:\nTraceback (most recent call last):\n"
               f'  File "{SITE}/torch/multiprocessing/spawn.py", line 87, in _wrap\n    fn(i, *args)\n'
               '  File "/work/sp.py", line 11, in worker\n    raise ValueError("no data")\nValueError: no data\n')
    f = exception_finding(0, exc(1.0, "ProcessRaisedException", message, ""))
    assert f.id == "DDP805" and f.ranks == [1] and f.evidence["spawn_process"] == 1
    assert f.message == ("spawned process 1 (torch.multiprocessing.spawn) failed: ValueError: no data at "
                         "/work/sp.py:11 in worker")
    known = exception_finding(0, exc(1.0, "ProcessRaisedException", message.replace(
        'ValueError("no data")\nValueError: no data', 'KeyError("LOCAL_RANK")\nKeyError: \'LOCAL_RANK\''), ""))
    assert known.id == "DDP834" and known.ranks == [1]
    exited = exception_finding(0, exc(1.0, "ProcessExitedException", "process 1 terminated with exit code 3", ""))
    assert exited.id == "DDP805" and exited.ranks == [1] and "exit code 3" in exited.message


def test_a_lost_peer_as_the_cause_of_a_wrapper_is_a_consequence():
    tb = (f"Traceback (most recent call last):\nRuntimeError: {GLOO_CLOSED}\n\nThe above exception was the direct "
          "cause of the following exception:\n\nTraceback (most recent call last):\n"
          '  File "/w/t.py", line 9, in <module>\nRuntimeError: step failed\n')
    f = exception_finding(0, exc(1.0, "RuntimeError", "step failed", tb))
    assert f.id == "DDP802" and f.caused_by is not None and f.evidence["signature"] == "DDP826"


# -------------------------------------------------------------------- B: same error on several ranks

def test_equal_but_for_the_ranks_own_numbers():
    def e(m: str) -> dict:
        return exc(1.0, "ValueError", m)
    assert same_error_modulo_rank(e("device_ids [0] on cuda:0"), 0, e("device_ids [1] on cuda:1"), 1)
    assert same_error_modulo_rank(e("[rank0]: bad input on rank 0"), 0, e("[rank1]: bad input on rank 1"), 1)
    assert not same_error_modulo_rank(e("expected 4 got 0"), 0, e("expected 4 got 7"), 1)  # 7 is not rank 1's
    assert not same_error_modulo_rank(e("loss 0.5"), 0, e("loss 1.5"), 1)  # a decimal is never a rank
    assert not same_error_modulo_rank(e("device_ids [0]"), 0, e("device_ids [1] and more"), 1)
    assert not same_error_modulo_rank(e("device_ids [0]"), 0, exc(1.0, "KeyError", "device_ids [1]"), 1)
    # the local rank counts too, when the record carries it (rank 9 is cuda:1 on its node)
    assert not same_error_modulo_rank(e("cuda:0"), 8, e("cuda:1"), 9)
    assert same_error_modulo_rank(e("cuda:0"), 8, e("cuda:1"), 9, local_a=0, local_b=1)
    # a wrapped error is compared by its real error
    assert same_error_modulo_rank(dl_exc(1.0), 0, dl_exc(2.0), 1)


DEVICE_IDS = ("DistributedDataParallel device_ids and output_device arguments only work with single-device/"
              "multiple-device GPU modules or CPU modules, but got device_ids [{r}], output_device None, and "
              "module parameters {{device(type='cpu')}}.")


def test_the_same_error_on_each_rank_but_for_its_number_is_one_cause_on_both():
    outcomes = {r: outcome(exc(10.0 + r / 10, "ValueError", DEVICE_IDS.format(r=r))) for r in (0, 1)}
    findings, code = training_findings(outcomes, {0: 1, 1: 1}, [0, 1])
    assert [f.id for f in findings] == ["DDP800"], [f.message for f in findings]
    (f,) = findings
    assert f.ranks == [0, 1] and f.caused_by is None
    assert f.message.startswith("ranks 0-1 each raised ValueError: DistributedDataParallel device_ids")
    assert "device_ids [0]" in f.message and "as rank 0 wrote it" in f.message
    assert "device_ids [1]" in f.evidence["per_rank"]["1"]["error"]
    rep = build_report(world={}, ranks=[], findings=findings, phase="training")
    assert rep["root_cause"]["ranks"] == [0, 1] and code == 1
    assert not [x for x in rep["findings"] if x["id"] == "DDP802"]


def test_a_genuinely_different_later_error_is_still_a_peer_failure():
    outcomes = {0: outcome(exc(10.0, "ValueError", DEVICE_IDS.format(r=0))),
                1: outcome(exc(10.5, "RuntimeError", "shapes (4,) and (5,) differ on rank 1"))}
    findings, _ = training_findings(outcomes, {0: 1, 1: 1}, [0, 1])
    by = {f.id: f for f in findings}
    assert by["DDP800"].ranks == [0] and by["DDP802"].ranks == [1] and by["DDP802"].caused_by is not None
    assert "after rank 0 failed" in by["DDP802"].message


def test_equal_texts_stay_one_finding_per_rank_for_the_report_to_merge():
    outcomes = {r: outcome(exc(10.0 + r, "ValueError", "bad batch")) for r in (0, 1)}
    findings, _ = training_findings(outcomes, {}, [0, 1])
    assert sorted(f.ranks[0] for f in findings) == [0, 1] and {f.id for f in findings} == {"DDP800"}
    rep = build_report(world={}, ranks=[], findings=findings, phase="training")
    assert rep["root_cause"]["ranks"] == [0, 1] and len(rep["findings"]) == 1


def test_alike_ranks_are_grouped_and_a_third_ranks_lost_peer_stays_a_consequence():
    outcomes = {0: outcome(exc(10.0, "RuntimeError", "no kernel image for cuda:0")),
                1: outcome(exc(10.1, "RuntimeError", "no kernel image for cuda:1")),
                2: outcome(exc(10.2, "RuntimeError", GLOO_CLOSED))}
    findings, _ = training_findings(outcomes, {}, [0, 1, 2])
    assert sorted((f.id, tuple(f.ranks)) for f in findings) == [("DDP800", (0, 1)), ("DDP802", (2,))]


def test_alike_lost_peer_errors_are_each_kept_as_consequences():
    outcomes = {r: outcome(exc(10.0 + r, "RuntimeError", f"{GLOO_CLOSED} on rank {r}")) for r in (0, 1)}
    findings, code = training_findings(outcomes, {2: -9}, [0, 1, 2])
    peers = sorted(f.ranks[0] for f in findings if f.id == "DDP802")
    assert peers == [0, 1] and all(f.caused_by is not None for f in findings if f.id == "DDP802")
    assert code == 137
