"""The history on real launches: a self-launched preflight records its figures; after a host's
history holds enough comparable runs, a preflight over a throttled link (every all_reduce of 1 MiB
or more 0.25 s slower: tests/plugins/throttled_transport.py) is flagged against that host's own
history (DDP409), not against another host's. A run records its step time, keyed by its script and
arguments, and a slower run of the same script and arguments is flagged.

One module fixture launches both tests' runs, two at a time: each history's first run, then (its
past added to what that run recorded) the run judged against it. Each test reads its own."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers.procs import DDP, Launch, clean_env, load_json, result_of, run_all

from ddp_doctor.history.database import History, RunRecord
from ddp_doctor.history.from_report import BUSY

pytestmark = pytest.mark.slow
ROOT = str(Path(__file__).resolve().parents[2])
PREFLIGHT = [*DDP, "preflight", "--select", "communication", "--timeout", "60"]
RUN = [*DDP, "run", "--nproc-per-node", "2", "--skip", "communication"]
STEPS_SCRIPT = str(Path(__file__).resolve().parents[1] / "run_scripts" / "rank1_slow_compute.py")
ARGS = ["--epochs", "1"]  # the script ignores its arguments; the history keys its step time by them


def preflight_past(base: RunRecord) -> list[RunRecord]:
    """Eight more runs like the first, on a quiet machine (only quiet runs are compared); another
    host's, slower by nature."""
    quiet = {**base.figures, BUSY: 0.0}
    past = [dataclasses.replace(base, time=base.time - 3600 * (i + 1), figures=quiet) for i in range(8)]
    return past + [dataclasses.replace(base, host="algo-2", time=base.time - 60 * i,
                                       figures={k: v * 0.2 if k != BUSY else 0.0 for k, v in base.figures.items()})
                   for i in range(10)]


def run_past(base: RunRecord) -> list[RunRecord]:
    """Seven more runs like the first, quiet ones."""
    return [dataclasses.replace(base, time=base.time - 3600 * (i + 1), figures={**base.figures, BUSY: 0.0})
            for i in range(7)]


def launches(d: Path) -> dict[str, tuple[Launch, Launch]]:
    """name -> (its first launch, the launch judged against its history), each writing d/name."""
    hist = {name: ["--history", str(d / name / "history.sqlite")] for name in ("preflight", "run")}
    return {
        "preflight": (
            Launch([*PREFLIGHT, *hist["preflight"], "--report", str(d / "preflight" / "r1.json")], clean_env(),
                   str(d / "preflight"), 180),
            # 0.25 s: many times what a busy machine takes for an all_reduce of 1-8 MiB, so more than
            # half of the sizes the sweep times (1-64 MiB) fall far below their band (DDP409 needs half)
            Launch([*PREFLIGHT, *hist["preflight"], "--report", str(d / "preflight" / "r2.json")],
                   clean_env(DDP_DOCTOR_CHECK_MODULES="tests.plugins.throttled_transport", PYTHONPATH=ROOT,
                             THROTTLE_S="0.25"), str(d / "preflight"), 300)),
        "run": (
            Launch([*RUN, *hist["run"], "--report", str(d / "run" / "r1.json"), STEPS_SCRIPT, *ARGS],
                   clean_env(SLOW_S="0", STEPS="40"), str(d / "run"), 180),
            # every rank of the job 0.2 s slower per step: the whole job slows down, no rank stands out
            Launch([*RUN, *hist["run"], "--report", str(d / "run" / "r2.json"), STEPS_SCRIPT, *ARGS],
                   clean_env(SLOW_S="0.2", STEPS="12", SLOW_RANKS="0,1"), str(d / "run"), 180)),
    }


def _raise(e: BaseException) -> None:
    raise e


@pytest.fixture(scope="module")
def histories(tmp_path_factory):
    """name -> {"dir", "first": its result, "base": the record it left, "second": the result of the
    run judged against base and its past (or what stopped that run, raised by the test)}."""
    d = tmp_path_factory.mktemp("history")
    jobs = launches(d)
    for name in jobs:
        (d / name).mkdir()
    first = run_all({name: pair[0] for name, pair in jobs.items()}, at_once=2)
    out = {name: {"dir": d / name, "first": first[name], "base": None} for name in jobs}
    second: dict = {}
    for name, past in (("preflight", preflight_past), ("run", run_past)):
        try:
            assert result_of(first, name).rc == 0, result_of(first, name).output
            (out[name]["base"],) = History(str(d / name / "history.sqlite")).records()
            assert History(str(d / name / "history.sqlite")).add(past(out[name]["base"])) is None
            second[name] = jobs[name][1]
        except BaseException as e:  # noqa: BLE001 - raised by the test that reads it
            second[name] = lambda e=e: _raise(e)
    for name, res in run_all(second, at_once=2).items():
        out[name]["second"] = res
    return out


def test_a_throttled_link_is_flagged_against_this_hosts_own_history(histories):
    h = histories["preflight"]
    first, slow, base = result_of(h, "first"), result_of(h, "second"), h["base"]
    assert first.rc == 0, first.output
    hist = str(h["dir"] / "history.sqlite")
    assert base.kind == "preflight" and base.world_size == 2 and base.backend == "gloo"
    sizes = [n for n in base.figures if n.startswith("all_reduce.busbw_gbps@")]
    assert sizes and "stage_seconds.total" in base.figures, base.figures
    # whether this (shared, 2-core) machine was busy while DDP405 timed its rounds is kept with it
    assert BUSY in base.figures, base.figures
    base_quiet = base.figures[BUSY] == 0.0
    rep = load_json(str(h["dir"] / "r2.json"))
    (f,) = [f for f in rep["findings"] if f["id"] == "DDP409"]
    # a warning, or info when this machine was busy while the throttled run was timed
    busy_now = rep["measurements"]["host_load"]["busy"]
    assert f["severity"] == ("info" if busy_now else "warning") and f["evidence"]["host"] == base.host, f
    worst = max(f["evidence"]["drops"], key=lambda d: d["below"])
    # its own quiet past (the first run too, when it was quiet), not algo-2's
    assert worst["runs"] == 8 + base_quiet and worst["median"] == base.figures[worst["figure"]], f
    assert len(f["evidence"]["compared"]) == worst["runs"], f
    assert f"on {base.host} all_reduce" in f["message"] and "below this host's median" in f["message"]
    assert slow.rc == 0, slow.output  # a warning: the preflight still passes
    # the throttled run is recorded too: the host's series goes on
    assert len(History(hist).records(host=base.host)) == 10 and History(hist).count() == 20


def test_a_run_records_its_step_time_and_a_slower_run_of_the_same_script_is_flagged(histories):
    from ddp_doctor.training.probes.recorder import script_identity

    h = histories["run"]
    first, slow, base = result_of(h, "first"), result_of(h, "second"), h["base"]
    assert first.rc == 0, first.output
    training = load_json(str(h["dir"] / "r1.json"))["measurements"]["training"]
    assert training["steps"] == 40 and training["ranks_measured"] == 2 and training["script"] == "rank1_slow_compute.py"
    # the step time is keyed by the script and its arguments as the ranks got them: the same script
    # with other arguments is another series, never compared with this one (tests/history/test_from_report.py)
    key = script_identity([STEPS_SCRIPT, *ARGS])["key"]
    assert training["script_key"] == key != script_identity([STEPS_SCRIPT])["key"], training
    assert base.kind == "run" and base.gpus == []  # CPU ranks: no GPU UUID to keep
    figure = f"training.median_step_s@{key}"
    assert base.figures[figure] == training["median_step_s"], base.figures
    assert base.script == "rank1_slow_compute.py" and BUSY in base.figures, base  # the load, from the ledgers
    base_quiet = base.figures[BUSY] == 0.0
    assert slow.rc == 0, slow.output
    rep = load_json(str(h["dir"] / "r2.json"))
    (f,) = [f for f in rep["findings"] if f["id"] == "DDP409"]
    assert f["evidence"]["host"] == base.host and f["evidence"]["drops"][0]["figure"] == figure, f
    assert f["evidence"]["drops"][0]["runs"] == 7 + base_quiet and "the training step took a median" in f["message"], f
    assert {r["script"] for r in f["evidence"]["compared"]} == {"rank1_slow_compute.py"}, f
    # a warning on a quiet machine; info, which leaves the verdict a pass, on a busy one
    busy_now = rep["measurements"]["host_load"]["busy"]
    assert (f["severity"], rep["status"]) == (("info", "pass") if busy_now else ("warning", "warn")), f
