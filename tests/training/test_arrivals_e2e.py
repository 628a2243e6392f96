"""The rank that makes the others wait (DDP877) on real gloo ranks under `ddp-doctor run`:
a rank slowed in its own compute is named with its lag and the line it spends its time at; a rank
slowed in reading its data is named as waiting for data; a correct run, started together with
those (the machine's own load: 2 cores, three jobs of two ranks and one of four), gets no such
finding. The node that makes the others wait (DDP878): two simulated nodes of two ranks under
torchrun, every rank of one of them slowed; named on the clocks the preflight aligned, by the
report each node writes. One module fixture starts every launch at once; each test reads its own."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.procs import DDP, Launch, clean_env, load_json, outputs, result_of, run_all

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("arrivals")
    # compute: long enough (about 15 s) for a dozen stack samples, one a second, to say where rank 1 works
    jobs = {"compute": ("rank1_slow_compute.py", {"STEPS": "300"}), "data": ("rank1_slow_data.py", {}),
            # one correct run: the load it is judged under is the others' (two slowed jobs, four ranks on
            # two nodes); more copies of it would repeat the same case
            "correct": ("rank1_slow_compute.py", {"SLOW_S": "0"})}
    launches = {name: Launch([*DDP, "run", "--nproc-per-node", "2", "--skip", "communication",
                              "--report", str(base / f"{name}.json"),
                              *(["--trace", str(base / "compute-trace.json")] if name == "compute" else []),
                              str(SCRIPTS / script)],
                             clean_env(**env), str(base), 180)
                for name, (script, env) in jobs.items()}
    jobs = {**launches, "slow_node": lambda: _two_nodes(base / "slow_node")}
    return {"base": base, "results": run_all(jobs, at_once=len(jobs))}


def _two_nodes(d: Path) -> list:
    """One torchrun per simulated node (algo-1, algo-2), two ranks each, a run directory each; the
    preflight measures the clocks only (DDP407), the rest of it is not what this test is about."""
    from helpers.nodes import run_nodes

    d.mkdir()

    def env_for(host: str) -> dict[str, str]:  # a node's own disk: its run directory, its report
        (d / f"tmp-{host}").mkdir(exist_ok=True)
        # 100 steps: the slow node's ranks sleep about 5 s, a dozen stack samples (one a second) to say where
        return clean_env(TMPDIR=str(d / f"tmp-{host}"), DDP_DOCTOR_REPORT=str(d / f"{host}.json"), STEPS="100")

    return run_nodes(d, ["algo-1", "algo-2"], ["run", "--select", "DDP407", str(SCRIPTS / "node_slow_compute.py")],
                     nproc=2, env_for=env_for, timeout=180)


def _report(runs: dict, name: str) -> dict:
    res = result_of(runs["results"], name)
    assert res.rc == 0, res.output
    return load_json(str(runs["base"] / f"{name}.json"))


def _line(script: str, text: str) -> int:
    return next(i for i, ln in enumerate((SCRIPTS / script).read_text().splitlines(), 1) if text in ln)


def test_a_rank_slow_in_its_own_compute_is_named_with_its_lag_and_its_line(runs):
    rep = _report(runs, "compute")
    (f,) = [f for f in rep["findings"] if f["id"] == "DDP877"]
    assert f["ranks"] == [1] and f["severity"] == "warning", f
    ev = f["evidence"]
    assert ev["last"] >= 0.75 * ev["compared"] and ev["compared"] >= 300, ev
    assert ev["median_lag_s"] >= 0.04, ev  # the 50 ms sleep, less the noise
    sleep = f"rank1_slow_compute.py:{_line('rank1_slow_compute.py', 'time.sleep(slow)')} in <module>"
    assert "before arriving it works at " in f["message"] and sleep in f["message"], f["message"]
    assert rep["status"] == "warn"  # the job ended well: a warning, its exit status its own
    arrived = rep["measurements"]["arrivals"]  # every run report sums up the arrivals
    assert arrived["clocks"] == "one host" and arrived["ranks"]["1"]["median_ms"] >= 40, arrived
    # the trace shows each collective's lag behind the first rank of the host
    trace = load_json(str(runs["base"] / "compute-trace.json"))
    lags = {}
    for e in trace["traceEvents"]:
        lag = (e.get("args") or {}).get("arrived_after_first_ms")
        if lag is not None:
            lags.setdefault(e["pid"], []).append(lag)
    assert len(lags) == 2, sorted(lags)
    slow, fast = sorted(lags.values(), key=lambda v: sorted(v)[len(v) // 2])[::-1]
    assert sorted(slow)[len(slow) // 2] >= 40 and sorted(fast)[len(fast) // 2] == 0, (slow[:5], fast[:5])


def test_a_rank_slow_to_read_its_data_is_named_as_waiting_for_data(runs):
    rep = _report(runs, "data")
    (f,) = [f for f in rep["findings"] if f["id"] == "DDP877"]
    assert f["ranks"] == [1] and "before arriving it waits for its data" in f["message"], f["message"]


def test_a_correct_run_under_the_machines_own_load_has_no_straggler(runs):
    rep = _report(runs, "correct")
    assert not [f for f in rep["findings"] if f["id"] == "DDP877"], rep["findings"]


def test_a_node_whose_every_rank_is_slow_is_named_on_the_preflights_aligned_clocks(runs):
    results = result_of(runs["results"], "slow_node")
    assert [r.rc for r in results] == [0, 0], outputs(results)
    rep = load_json(str(runs["base"] / "slow_node" / "algo-1.json"))  # rank 0's node writes the verdict
    assert rep["status"] == "warn" and set(rep["measurements"]["clock_offset_s"]) == {"0", "1", "2", "3"}, rep
    (f,) = [f for f in rep["findings"] if f["id"] == "DDP878"]
    assert f["ranks"] == [2, 3] and f["evidence"]["host"] == "algo-2", f
    ev = f["evidence"]
    assert ev["last"] >= 0.75 * ev["compared"] and ev["compared"] >= 60 and ev["median_lag_s"] >= 0.04, ev
    # one machine's clocks, measured through barriers: each host's measured offset (truly 0) lies
    # within the error the measurement gives itself, and the lag passes 10 ms by that error
    assert all(abs(o) <= ev["clock_error_s"] / 2 for o in ev["clock_offset_s"].values()), ev
    assert ev["median_lag_s"] >= 0.010 + ev["clock_error_s"], ev
    line = _line("node_slow_compute.py", "time.sleep(slow)")
    assert f"node_slow_compute.py:{line} in <module>" in f["message"], f["message"]
    # within the slow node neither rank stands out: no rank is named as the one the others wait for
    assert not [f for f in rep["findings"] if f["id"] == "DDP877"], rep["findings"]
    assert rep["measurements"]["arrivals"]["clocks"] == "aligned across hosts", rep["measurements"]["arrivals"]
    # the last rank to end writes the verdict on its node too: when that was algo-2, it says the same
    # (the preflight's report, with the clocks, came to it with rank 0's ending)
    other = runs["base"] / "slow_node" / "algo-2.json"
    if other.exists():
        again = load_json(str(other))
        assert [(f["id"], f["ranks"]) for f in again["findings"]] == [(f["id"], f["ranks"]) for f in rep["findings"]]
    assert "WARN (0 error(s), 1 warning(s)) - 4 rank(s) on 2 node(s)" in results[0].output, results[0].output
