"""The S3 history's whole-call deadlines (history/s3_bucket.py WRITE_DEADLINE_S, READ_DEADLINE_S)
against a loopback endpoint that answers a byte a second (botocore's read timeout never fires):
a write ends in one line, a read in no records, a comparison against several hosts waits once,
and a stop cuts a report's history write short. Every wait is bounded by a thread join."""
from __future__ import annotations

import os
import threading
from typing import Iterator

import pytest

boto3 = pytest.importorskip("boto3")

from helpers.trickle_endpoint import TrickleEndpoint, in_thread  # noqa: E402

from ddp_doctor.history import s3_bucket as s3_store  # noqa: E402
from ddp_doctor.history.database import RunRecord  # noqa: E402
from ddp_doctor.history.s3_bucket import S3History  # noqa: E402

BOUND = 60.0  # far past the 2 s deadlines set here, far short of a trickled answer's minutes


@pytest.fixture
def trickle(monkeypatch: pytest.MonkeyPatch) -> Iterator[TrickleEndpoint]:
    endpoint = TrickleEndpoint()
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    for k, v in endpoint.env().items():
        monkeypatch.setenv(k, v)
    yield endpoint
    endpoint.close()


def _rec(host: str) -> RunRecord:
    return RunRecord(time=1_700_000_000, kind="preflight", host=host, world_size=2, nnodes=1, nproc_per_node=2,
                     backend="gloo", versions={"torch": "2.13.0"}, status="pass", figures={"x": 1.0})


REPORT = {"phase": "preflight", "status": "pass",
          "world": {"world_size": 2, "nnodes": 2, "nproc_per_node": 1, "backend": "gloo",
                    "instance_type": "ml.p4d.24xlarge"},
          "ranks": [{"rank": 0, "host": "algo-1", "versions": {"torch": "2.13.0"}},
                    {"rank": 1, "host": "algo-2", "versions": {"torch": "2.13.0"}}],
          "measurements": {"all_reduce": [{"bytes": 268435456, "busbw_gbps": 90.0, "correct": True}]},
          "findings": []}


@pytest.mark.slow
def test_a_trickling_write_ends_at_its_deadline_in_one_line(trickle: TrickleEndpoint,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3_store, "WRITE_DEADLINE_S", 2.0)
    t, got = in_thread(lambda: S3History("s3://fleet/runs").add([_rec("algo-1")]))
    t.join(BOUND)
    assert not t.is_alive(), "the write outlived its deadline"
    assert "error" not in got, got
    said = got["value"]
    assert said == "the history s3://fleet/runs could not be written: no answer within 2 s (a write's whole " \
                   "deadline: the endpoint is slow)", said
    assert trickle.trickling.is_set() and trickle.requests[0][0] == "PUT"


@pytest.mark.slow
def test_a_trickling_read_is_no_records_and_one_wait_for_every_host(trickle: TrickleEndpoint,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A comparison reads each host's and the instance type's records: once the first read ran
    out, the others are not asked (one request in all), so the report waits one deadline."""
    from ddp_doctor.checks.history_rules import against_history
    monkeypatch.setattr(s3_store, "READ_DEADLINE_S", 2.0)
    t, got = in_thread(lambda: against_history(REPORT, {"DDP_DOCTOR_HISTORY": "s3://fleet/runs"}))
    t.join(BOUND)
    assert not t.is_alive(), "the comparison outlived the read's deadline"
    assert got == {"value": []}, got
    assert [(method, path.split("?")[0]) for method, path, _ in trickle.requests] == [("GET", "/fleet")]

    h = S3History("s3://fleet/runs")
    t, got = in_thread(lambda: (h.records(host="algo-1"), h.records(), h.count()))
    t.join(BOUND)
    assert not t.is_alive() and got == {"value": ([], [], 0)}, got
    assert len(trickle.requests) == 2  # the first read of this history only


def test_a_stop_cuts_the_reports_history_write_short(trickle: TrickleEndpoint, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """publish() with a parent's stop (SignalCatcher.wait_new): a stop signal while the history's
    write waits ends the wait (the deadline, set far away here, does not), with one warning."""
    from ddp_doctor.report.publish import Output, publish
    monkeypatch.setattr(s3_store, "WRITE_DEADLINE_S", 600.0)
    came = threading.Event()

    def stop(seconds: float) -> str | None:
        return "SIGTERM" if came.wait(seconds) else None

    env = {**os.environ, "DDP_DOCTOR_HISTORY": "s3://fleet/runs"}
    t, got = in_thread(lambda: publish(REPORT, Output(quiet=True), env=env, write=False, stop=stop))
    assert trickle.trickling.wait(BOUND), "the history's write never reached the endpoint"
    came.set()
    t.join(BOUND)
    assert not t.is_alive(), "the stop did not end the history's write"
    assert got == {"value": None}, got
    err = capsys.readouterr().err
    assert err == "ddp-doctor: warning: the history s3://fleet/runs could not be written: cut short by a stop " \
                  "signal\n", err
