"""The history on real preflights: a self-launched preflight records its figures; after
a host's history holds enough comparable runs, a preflight over a throttled link (every all_reduce
of 1 MiB or more 0.5 s slower: tests/plugins/throttled_transport.py) is flagged against that
host's own history (DDP409), not against another host's."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers.procs import DDP, clean_env, load_json, run

from ddp_doctor.history.database import History
from ddp_doctor.history.from_report import BUSY

pytestmark = pytest.mark.slow
ROOT = str(Path(__file__).resolve().parents[2])
PREFLIGHT = [*DDP, "preflight", "--select", "communication", "--timeout", "60"]


def test_a_throttled_link_is_flagged_against_this_hosts_own_history(tmp_path):
    hist = str(tmp_path / "history.sqlite")
    first = run([*PREFLIGHT, "--history", hist, "--report", str(tmp_path / "r1.json")], clean_env(), str(tmp_path),
                timeout=180)
    assert first.rc == 0, first.output
    (base,) = History(hist).records()
    assert base.kind == "preflight" and base.world_size == 2 and base.backend == "gloo"
    sizes = [n for n in base.figures if n.startswith("all_reduce.busbw_gbps@")]
    assert sizes and "stage_seconds.total" in base.figures, base.figures
    # whether this (shared, 2-core) machine was busy while DDP405 timed its rounds is kept with it
    assert BUSY in base.figures, base.figures
    base_quiet = base.figures[BUSY] == 0.0
    # its past: eight more runs like this one, on a quiet machine (only quiet runs are compared);
    # another host's, slower by nature
    quiet = {**base.figures, BUSY: 0.0}
    past = [dataclasses.replace(base, time=base.time - 3600 * (i + 1), figures=quiet) for i in range(8)]
    past += [dataclasses.replace(base, host="algo-2", time=base.time - 60 * i,
                                 figures={k: v * 0.2 if k != BUSY else 0.0 for k, v in base.figures.items()})
             for i in range(10)]
    assert History(hist).add(past) is None
    slow = run([*PREFLIGHT, "--history", hist, "--report", str(tmp_path / "r2.json")],
               clean_env(DDP_DOCTOR_CHECK_MODULES="tests.plugins.throttled_transport", PYTHONPATH=ROOT,
                         THROTTLE_S="0.5"), str(tmp_path), timeout=300)
    rep = load_json(str(tmp_path / "r2.json"))
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


RUN = [*DDP, "run", "--nproc-per-node", "2", "--skip", "communication"]
STEPS_SCRIPT = str(Path(__file__).resolve().parents[1] / "run_scripts" / "rank1_slow_compute.py")


def test_a_run_records_its_step_time_and_a_slower_run_of_the_same_script_is_flagged(tmp_path):
    hist = str(tmp_path / "history.sqlite")
    first = run([*RUN, "--history", hist, "--report", str(tmp_path / "r1.json"), STEPS_SCRIPT],
                clean_env(SLOW_S="0", STEPS="40"), str(tmp_path), timeout=180)
    assert first.rc == 0, first.output
    training = load_json(str(tmp_path / "r1.json"))["measurements"]["training"]
    assert training["steps"] == 40 and training["ranks_measured"] == 2 and training["script"] == "rank1_slow_compute.py"
    (base,) = History(hist).records()
    assert base.kind == "run" and base.gpus == []  # CPU ranks: no GPU UUID to keep
    figure = f"training.median_step_s@{training['script_key']}"
    assert base.figures[figure] == training["median_step_s"], base.figures
    assert base.script == "rank1_slow_compute.py" and BUSY in base.figures, base  # the load, from the ledgers
    base_quiet = base.figures[BUSY] == 0.0
    # its past: seven more runs like it, quiet ones; and the same script with other arguments is another series
    past = [dataclasses.replace(base, time=base.time - 3600 * (i + 1), figures={**base.figures, BUSY: 0.0})
            for i in range(7)]
    assert History(hist).add(past) is None
    # every rank of the job 0.2 s slower per step: the whole job slows down, no rank stands out
    slow = run([*RUN, "--history", hist, "--report", str(tmp_path / "r2.json"), STEPS_SCRIPT],
               clean_env(SLOW_S="0.2", STEPS="12", SLOW_RANKS="0,1"), str(tmp_path), timeout=180)
    assert slow.rc == 0, slow.output
    rep = load_json(str(tmp_path / "r2.json"))
    (f,) = [f for f in rep["findings"] if f["id"] == "DDP409"]
    assert f["evidence"]["host"] == base.host and f["evidence"]["drops"][0]["figure"] == figure, f
    assert f["evidence"]["drops"][0]["runs"] == 7 + base_quiet and "the training step took a median" in f["message"], f
    assert {r["script"] for r in f["evidence"]["compared"]} == {"rank1_slow_compute.py"}, f
    # a warning on a quiet machine; info, which leaves the verdict a pass, on a busy one
    busy_now = rep["measurements"]["host_load"]["busy"]
    assert (f["severity"], rep["status"]) == (("info", "pass") if busy_now else ("warning", "warn")), f
    # another script's (or arguments') step time is never compared with this one's
    other = run([*RUN, "--history", hist, "--report", str(tmp_path / "r3.json"), STEPS_SCRIPT, "--other"],
                clean_env(SLOW_S="0.2", STEPS="12", SLOW_RANKS="0,1"), str(tmp_path), timeout=180)
    assert other.rc == 0, other.output
    assert not [f for f in load_json(str(tmp_path / "r3.json"))["findings"] if f["id"] == "DDP409"]
