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
