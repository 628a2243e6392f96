"""The history on real preflights (issue 22): a self-launched preflight records its figures; after
a host's history holds enough comparable runs, a preflight over a throttled link (every all_reduce
of 1 MiB or more 0.5 s slower: tests/plugins/throttled_transport.py) is flagged against that
host's own history (DDP409), not against another host's."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers.procs import DDP, clean_env, load_json, run

from ddp_doctor.history.store import History

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
    # its past: eight more runs like this one; another host's, slower by nature
    past = [dataclasses.replace(base, time=base.time - 3600 * (i + 1)) for i in range(8)]
    past += [dataclasses.replace(base, host="algo-2", time=base.time - 60 * i,
                                 figures={k: v * 0.2 for k, v in base.figures.items()}) for i in range(10)]
    assert History(hist).add(past) is None
    slow = run([*PREFLIGHT, "--history", hist, "--report", str(tmp_path / "r2.json")],
               clean_env(DDP_DOCTOR_CHECK_MODULES="tests.plugins.throttled_transport", PYTHONPATH=ROOT,
                         THROTTLE_S="0.5"), str(tmp_path), timeout=300)
    rep = load_json(str(tmp_path / "r2.json"))
    (f,) = [f for f in rep["findings"] if f["id"] == "DDP409"]
    assert f["severity"] == "warning" and f["evidence"]["host"] == base.host, f
    worst = max(f["evidence"]["drops"], key=lambda d: d["below"])
    assert worst["runs"] == 9 and worst["median"] == base.figures[worst["figure"]], f  # its own past, not algo-2's
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
    # its past: seven more runs like it; and the same script with other arguments is another series
    past = [dataclasses.replace(base, time=base.time - 3600 * (i + 1)) for i in range(7)]
    assert History(hist).add(past) is None
    # every rank of the job 0.2 s slower per step: the whole job slows down, no rank stands out
    slow = run([*RUN, "--history", hist, "--report", str(tmp_path / "r2.json"), STEPS_SCRIPT],
               clean_env(SLOW_S="0.2", STEPS="12", SLOW_RANKS="0,1"), str(tmp_path), timeout=180)
    assert slow.rc == 0, slow.output
    rep = load_json(str(tmp_path / "r2.json"))
    (f,) = [f for f in rep["findings"] if f["id"] == "DDP409"]
    assert f["evidence"]["host"] == base.host and f["evidence"]["drops"][0]["figure"] == figure, f
    assert f["evidence"]["drops"][0]["runs"] == 8 and "the training step took a median" in f["message"], f
    assert rep["status"] == "warn"
    # another script's (or arguments') step time is never compared with this one's
    other = run([*RUN, "--history", hist, "--report", str(tmp_path / "r3.json"), STEPS_SCRIPT, "--other"],
                clean_env(SLOW_S="0.2", STEPS="12", SLOW_RANKS="0,1"), str(tmp_path), timeout=180)
    assert other.rc == 0, other.output
    assert not [f for f in load_json(str(tmp_path / "r3.json"))["findings"] if f["id"] == "DDP409"]
