"""`ddp-doctor analyze` over what a job freshly launched by plain torchrun (not under ddp-doctor)
left, end to end: the console and `--log-dir` tree this torch writes, and the flight-recorder dumps
it writes, read by the command and judged to the root cause `ddp-doctor run` names for the same
failure (its verdict as recorded in tests/corpus/analyze/). Every other shape, launcher and input
is analyzed from its recording in test_analyze_recorded.py.
"""
from __future__ import annotations

import pytest
from helpers import corpus
from helpers.analyze_scenarios import artifacts, launches
from helpers.procs import DDP, Launch, clean_env, load_json, result_of, run_all
from helpers.scenarios import line_of

pytestmark = pytest.mark.slow
KEPT = ("raises", "sizes")  # a traceback in the console and the tree; each rank's dump of its ledger


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The plain jobs, then every analysis of what they left, each step three at a time."""
    base = tmp_path_factory.mktemp("postmortem")
    plain = {key: job for name in KEPT for key, job in launches(name, base).items() if key.startswith("torchrun-")}
    results = run_all(plain)
    # what each analysis reads: (job, the kinds of artifact it left)
    reads = {"console": ("raises", ["console"]), "log_dir": ("raises", ["logs"]),
             "both": ("raises", ["console", "logs"]), "dumps": ("sizes", ["console", "dumps"])}
    analyses, missing = {}, {}
    for what, (name, kinds) in reads.items():
        left = artifacts(base, name)
        if [k for k in kinds if k not in left]:
            missing[what] = AssertionError(f"torchrun-{name} left {sorted(left)}, not {kinds}")
            continue
        analyses[what] = Launch([*DDP, "analyze", *(str(left[k]) for k in kinds),
                                 "--report", str(base / f"analyze-{what}.json")], clean_env(), str(base), timeout=120)
    analyses = {**run_all(analyses), **missing}
    return {"base": base, "results": results, "analyses": analyses}


def analyzed(jobs: dict, what: str) -> tuple:
    """The result and the report of one analysis."""
    return result_of(jobs["analyses"], what), load_json(str(jobs["base"] / f"analyze-{what}.json"))


def cause(rep: dict) -> tuple:
    c = rep["root_cause"]
    return (c["id"], c["ranks"]) if c else None


def ran(name: str) -> dict:
    """The verdict of the same failure under `ddp-doctor run`, judged again from its recording."""
    return corpus.live(name)[1]


@pytest.mark.parametrize("what", ["console", "log_dir", "both"])
def test_analyze_of_a_fresh_torchrun_job_names_the_root_cause_run_names(jobs, what):
    assert result_of(jobs["results"], "torchrun-raises").rc != 0
    res, rep = analyzed(jobs, what)
    assert "Traceback (most recent call last)" not in res.output, res.output
    assert res.rc == 3, res.output
    assert cause(rep) == cause(ran("raises")) == ("DDP800", [1]), rep["findings"]
    assert rep["status"] == "fail" and rep["phase"] == "training"


def test_analyze_reads_the_dumps_this_torch_writes(jobs):
    """Each rank's flight recorder, dumped by torch's own call, read with the console: the same
    root cause, ranks and line as run's live ledger."""
    assert result_of(jobs["results"], "torchrun-sizes").rc != 0
    res, rep = analyzed(jobs, "dumps")
    assert res.rc == 3 and "Traceback (most recent call last)" not in res.output, res.output
    assert cause(rep) == cause(ran("sizes")), rep["findings"]
    assert line_of("size_mismatch.py", "dist.all_reduce(t)") in rep["root_cause"]["message"]
    assert not [f for f in rep["findings"] if f["id"] == "DDP951"], rep["findings"]  # every dump read
