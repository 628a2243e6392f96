"""`ddp-doctor diff` on report dicts (ddp_doctor.postmortem.report_diff) and its command on files: each
kind of difference is found, judged (worse, better, within noise, or a setting that changed) and
ordered, figures are judged against the pair's noise band in their own direction, only what got
worse fails the command (exit 3), noise between two runs of one job is left out, secrets are never
shown, and a file that is not a report is a one-line usage error."""
from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from ddp_doctor import cli
from ddp_doctor.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from ddp_doctor.postmortem.report_diff import (
    KINDS,
    diff_reports,
    render_text,
    report_problem,
    to_json,
    variable_kind,
)
from ddp_doctor.report.schema import validate_report

SECRET = "hf_" + "Zq8" * 10  # a Hugging Face token's shape


def _sweep(busbw_64m: float = 1.0) -> list[dict[str, Any]]:
    return [{"bytes": size, "count": size // 4, "type": "float", "redop": "sum", "time_us": 100.0 + i,
             "algbw_gbps": bw, "busbw_gbps": bw, "correct": True, "wrong": 0, "wrong_ranks": [], "iters": 5,
             "group": "world", "nranks": 2}
            for i, (size, bw) in enumerate(((1 << 20, busbw_64m / 4), (64 << 20, busbw_64m)))]


def _plateau(bw16: float, bw32: float, bw64: float, iters: int = 1) -> list[dict[str, Any]]:
    """The top of a sweep, as a CPU preflight times it (once per size) unless `iters` says otherwise."""
    return [{**_sweep()[-1], "bytes": size << 20, "count": (size << 20) // 4, "algbw_gbps": bw, "busbw_gbps": bw,
             "iters": iters} for size, bw in ((16, bw16), (32, bw32), (64, bw64))]


def on_gpus(rep: dict[str, Any]) -> dict[str, Any]:
    for entry in rep["ranks"]:
        entry["device"] = f"cuda:{entry['local_rank']}"
    return rep


def training(median_step_s: float, key: str = "k1") -> dict[str, Any]:
    return {"median_step_s": median_step_s, "steps": 40, "ranks_measured": 2, "script": "train.py", "script_key": key}


def _rank(rank: int, host: str = "node-a") -> dict[str, Any]:
    # the rank view's versions and env, as a report whose rank entries record them would hold them
    return {"rank": rank, "local_rank": rank, "node_rank": 0, "host": host, "device": "cpu",
            "versions": {"python": "3.11.9", "torch": "2.5.1", "cuda": None, "nccl": None, "numpy": "2.1.0",
                         "ddp_doctor": "0.1.0"},
            "env": {"NCCL_DEBUG": "WARN", "MASTER_ADDR": "node-a", "MASTER_PORT": "29500", "WORLD_SIZE": "2",
                    "RANK": str(rank), "OMP_NUM_THREADS": "1", "TORCHELASTIC_RUN_ID": "run-1",
                    "TORCHELASTIC_ERROR_FILE": f"/tmp/torchelastic_abc/attempt_0/{rank}/error.json",
                    "NCCL_DEBUG_FILE": "/tmp/ddp-doctor-run-111/nccl.%h.%p"},
            "pid": 1000 + rank, "time": 1763760000.0}


def _finding(fid: str, severity: str = "error", title: str = "Ranks missing at rendezvous") -> dict[str, Any]:
    return {"id": fid, "category": "network", "severity": severity, "title": title,
            "message": "WORLD_SIZE=3 but only 2 rank(s) checked in within 3 s", "hint": "Launch them all.",
            "ranks": [1], "evidence": {"arrived": [0]}, "phase": "preflight", "time": 1763760001.5, "caused_by": None}


def report(**changes: Any) -> dict[str, Any]:
    rep: dict[str, Any] = {
        "schema": "ddp-doctor.report", "schema_version": 1, "tool_version": "0.1.0", "status": "pass",
        "phase": "preflight",
        "world": {"launcher": "torchrun", "backend": "gloo", "world_size": 2, "nnodes": 1, "nproc_per_node": 2,
                  "master_addr": "node-a", "master_port": 29500, "platform": None},
        "ranks": [_rank(0), _rank(1)],
        "findings": [_finding("DDP500", "info", "GPU checks not applicable")],
        "measurements": {"all_reduce": _sweep(), "stage_seconds": {"total": 0.9, "launch": 5.8},
                         "check_seconds": {"DDP401": 0.54}},
        "root_cause": None,
    }
    rep.update(changes)
    return rep


def set_env(rep: dict[str, Any], name: str, value: str | None, ranks: tuple[int, ...] = (0, 1)) -> dict[str, Any]:
    for entry in rep["ranks"]:
        if entry["rank"] in ranks:
            if value is None:
                entry["env"].pop(name, None)
            else:
                entry["env"][name] = value
    return rep


def lines(good: dict[str, Any], bad: dict[str, Any], **kw: Any) -> list[str]:
    return [f"{d.kind} {d.line()}" for d in diff_reports(good, bad, **kw).differences]


def changes(good: dict[str, Any], bad: dict[str, Any], **kw: Any) -> list[tuple[str, str]]:
    return [(d.what, d.change) for d in diff_reports(good, bad, **kw).differences]


def test_the_fixture_is_a_valid_report() -> None:
    assert validate_report(report()) == []
    assert report_problem(report()) is None


def test_identical_reports_differ_in_nothing() -> None:
    result = diff_reports(report(), report())
    assert result.differences == [] and not result.worse
    assert result.not_compared == []


def test_noise_between_two_runs_of_one_job_is_left_out() -> None:
    bad = report(world={**report()["world"], "master_port": 41234})
    for i, entry in enumerate(bad["ranks"]):
        entry["pid"], entry["time"] = 5000 + i, 1763769999.0
        entry["env"].update({"MASTER_PORT": "41234", "TORCHELASTIC_RUN_ID": "run-2", "RANK": str(i),
                             "TORCHELASTIC_ERROR_FILE": f"/tmp/torchelastic_zz9/attempt_0/{i}/error.json",
                             "NCCL_DEBUG_FILE": "/tmp/ddp-doctor-run-222/nccl.%h.%p", "SLURM_JOB_ID": "99",
                             "SLURM_TASK_PID": "4242"})
    bad["findings"] = [{**_finding("DDP500", "info", "GPU checks not applicable"), "time": 1763769999.0,
                        "message": "another wording"}, _finding("DDP590", "info", "Host facts")]
    bad["measurements"] = {"all_reduce": _sweep(1.15), "stage_seconds": {"total": 3.1, "launch": 12.0},
                           "check_seconds": {"DDP401": 2.5}}
    for e in bad["measurements"]["all_reduce"]:
        e["time_us"], e["iters"] = e["time_us"] * 3, 2
    result = diff_reports(report(), bad)
    # the bandwidth moved 15%: it is listed, as within noise (the 25% floor of a figure measured on
    # CPU), and fails nothing; nothing else is listed at all
    assert [(d.what, d.change) for d in result.differences] == [("all_reduce busbw at 64 MiB", "within_noise")], \
        [d.line() for d in result.differences]
    assert not result.worse


def test_versions_come_first_and_name_the_library() -> None:
    bad = report(tool_version="0.2.0")
    for entry in bad["ranks"]:
        entry["versions"]["torch"] = "2.6.0"
    bad["ranks"][1]["versions"]["nccl"] = "2.21.5"
    set_env(bad, "NCCL_SOCKET_IFNAME", "eth0")
    bad["world"]["world_size"] = 4
    got = lines(report(), bad)
    assert got == ["versions torch: 2.5.1 -> 2.6.0",
                   "versions NCCL: (none) -> (none) (rank 0); 2.21.5 (rank 1)",
                   "versions ddp-doctor: 0.1.0 -> 0.2.0",
                   "nccl_env NCCL_SOCKET_IFNAME: (unset) -> eth0",
                   "world world_size: 2 -> 4"]
    # settings that differ are the likely causes of what got worse, not worse in themselves
    result = diff_reports(report(), bad)
    assert {d.change for d in result.differences} == {"changed"} and not result.worse


def test_nccl_fi_and_launcher_variables_in_their_groups() -> None:
    bad = set_env(report(), "NCCL_SOCKET_IFNAME", "lo")
    set_env(bad, "FI_PROVIDER", "tcp")
    set_env(bad, "NCCL_DEBUG", "INFO", ranks=(1,))
    set_env(bad, "WORLD_SIZE", "4")
    set_env(bad, "SM_HOSTS", '["algo-1","algo-2"]')
    set_env(bad, "OMP_NUM_THREADS", None)
    got = lines(report(), bad)
    assert got == ["nccl_env FI_PROVIDER: (unset) -> tcp",
                   "nccl_env NCCL_DEBUG: WARN -> WARN (rank 0); INFO (rank 1)",
                   "nccl_env NCCL_SOCKET_IFNAME: (unset) -> lo",
                   "launcher_env SM_HOSTS: (unset) -> [\"algo-1\",\"algo-2\"]",
                   "launcher_env WORLD_SIZE: 2 -> 4",
                   "other_env OMP_NUM_THREADS: 1 -> (unset)"]


def test_variable_kinds() -> None:
    assert variable_kind("NCCL_IB_HCA") == variable_kind("FI_EFA_USE_DEVICE_RDMA") == "nccl_env"
    assert variable_kind("TORCH_NCCL_BLOCKING_WAIT") == variable_kind("GLOO_SOCKET_IFNAME") == "nccl_env"
    for name in ("TORCHELASTIC_MAX_RESTARTS", "MASTER_ADDR", "SLURM_NNODES", "OMPI_COMM_WORLD_SIZE", "SM_HOSTS"):
        assert variable_kind(name) == "launcher_env", name
    for name in ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_JOBID", "TORCHELASTIC_ERROR_FILE",
                 "RANK", "LOCAL_RANK", "SLURM_PROCID", "SM_TRAINING_ENV", "SLURM_TASK_PID"):
        assert variable_kind(name) is None, name


def test_world_layout_instance_and_hosts() -> None:
    bad = report(world={"launcher": "mpirun", "backend": "nccl", "world_size": 2, "nnodes": 2, "nproc_per_node": 1,
                        "master_addr": "node-c", "master_port": 29500, "platform": "sagemaker",
                        "instance_type": "ml.p4d.24xlarge"},
                 ranks=[{**_rank(0, "node-c"), "device": "cuda:0"}, {**_rank(1, "node-a"), "device": "cuda:0"}])
    got = lines(report(), bad)
    assert got == ["world launcher: torchrun -> mpirun",
                   "world backend: gloo -> nccl",
                   "world nnodes: 1 -> 2",
                   "world nproc_per_node: 2 -> 1",
                   "world platform: (none) -> sagemaker",
                   "world devices: cpu -> cuda",
                   "instance instance type: (none) -> ml.p4d.24xlarge",
                   "hosts hosts: node-a -> node-a, node-c (only BAD: node-c)",
                   "hosts MASTER_ADDR: node-a -> node-c"]


def test_bandwidth_beyond_its_band_says_the_change_and_the_band() -> None:
    # was: a fixed 20% tolerance, beyond which any move (up too) was "a difference that matters";
    # now the move is judged against the pair's noise band, in the figure's direction
    result = diff_reports(report(), report(measurements={"all_reduce": _sweep(0.4)}))
    [d] = result.differences
    assert (d.kind, d.what, d.good, d.bad) == ("bandwidth", "all_reduce busbw at 64 MiB", "1 GB/s", "0.4 GB/s")
    assert d.ratio == pytest.approx(0.4) and (d.change, d.band, d.direction) == ("worse", 0.25, "higher is better")
    assert d.line() == ("all_reduce busbw at 64 MiB: 1 GB/s -> 0.4 GB/s (-60%, beyond this pair's noise band of "
                        "-25%/+33%: the 25% floor for figures measured on CPU)")
    # within the band: listed as within noise; --bw-tolerance replaces the floor
    assert changes(report(), report(measurements={"all_reduce": _sweep(0.85)})) == [
        ("all_reduce busbw at 64 MiB", "within_noise")]
    assert lines(report(), report(measurements={"all_reduce": _sweep(0.85)}), bw_tolerance=0.1) == [
        "bandwidth all_reduce busbw at 64 MiB: 1 GB/s -> 0.85 GB/s (-15%, beyond this pair's noise band of -10%/+11%: "
        "the least band --bw-tolerance sets, 10%)"]


def test_busbw_jitter_of_20_percent_between_two_identical_runs_is_within_noise(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # two back-to-back identical preflights on a busy CPU machine: 10.2 and 8.1 GB/s (-21%)
    good = _write(tmp_path, "good.json", report(measurements={"all_reduce": _sweep(10.2)}))
    bad = _write(tmp_path, "bad.json", report(measurements={"all_reduce": _sweep(8.1)}))
    assert cli.main(["diff", good, bad]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("ddp-doctor diff: nothing worse; 0 better, 1 within noise, 0 other")
    assert ("within noise (1):\n  bus bandwidth:\n    all_reduce busbw at 64 MiB: 10.2 GB/s -> 8.1 GB/s (-21%, within "
            "this pair's noise band of -25%/+33%: the 25% floor for figures measured on CPU)") in out
    assert "worse" not in out.split("\n", 1)[1]
    # the other way round (+26%) is no "better" either
    assert cli.main(["diff", "--json", bad, good]) == EXIT_OK
    [d] = json.loads(capsys.readouterr().out)["differences"]
    assert (d["change"], d["band"]) == ("within_noise", 0.25)


def test_the_band_is_widened_by_each_runs_own_spread() -> None:
    # GPU figures of 20 timed iterations: a 10% floor; GOOD's own figures at 16-64 MiB are 27% apart
    good = on_gpus(report(measurements={"all_reduce": _plateau(140.0, 170.0, 190.0, iters=20)}))
    bad = on_gpus(report(measurements={"all_reduce": _plateau(150.0, 150.0, 150.0, iters=20)}))
    [d] = diff_reports(good, bad).differences
    assert (d.change, d.band, d.band_from) == ("within_noise", pytest.approx(50 / 190),
                                               "GOOD's own spread over 16 MiB-64 MiB")
    assert "-21%, within this pair's noise band of -26%/+36%: GOOD's own spread over 16 MiB-64 MiB" in d.line()
    # BAD's spread counts as much, and --bw-tolerance only sets the floor: the spread still widens it
    assert diff_reports(bad, good, bw_tolerance=0.05).differences[0].band_from == "BAD's own spread over 16 MiB-64 MiB"
    # steady runs: the floor; GPU figures averaged over 5 or more iterations have a 10% one
    steady = on_gpus(report(measurements={"all_reduce": _plateau(190.0, 190.0, 190.0, iters=20)}))
    [d] = diff_reports(steady, bad).differences
    assert (d.change, d.band) == ("worse", 0.10) and "10% floor for GPU figures" in d.band_from
    # ... and figures of fewer timed iterations the 25% one
    once = on_gpus(report(measurements={"all_reduce": _plateau(190.0, 120.0, 150.0, iters=1)}))
    steady_once = on_gpus(report(measurements={"all_reduce": _plateau(190.0, 190.0, 190.0, iters=1)}))
    [d] = diff_reports(steady_once, on_gpus(report(measurements={"all_reduce": _plateau(160, 160, 160)}))).differences
    assert (d.change, d.band) == ("within_noise", 0.25) and "fewer than 5 timed iterations" in d.band_from
    assert diff_reports(steady_once, once).differences[0].band_from == "BAD's own spread over 16 MiB-64 MiB"


def test_a_4x_bandwidth_improvement_is_better_and_passes(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path, "good.json", report(measurements={"all_reduce": _sweep(1.0)}))
    fast = _write(tmp_path, "fast.json", report(measurements={"all_reduce": _sweep(4.0)}))
    assert cli.main(["diff", good, fast]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("ddp-doctor diff: nothing worse; 1 better, 0 within noise")
    assert ("better (1):\n  bus bandwidth:\n    all_reduce busbw at 64 MiB: 1 GB/s -> 4 GB/s (+300%, beyond this "
            "pair's noise band of -25%/+33%") in out
    assert cli.main(["diff", "--json", good, fast]) == EXIT_OK
    got = json.loads(capsys.readouterr().out)
    assert got["worse"] is False and got["counts"] == {"worse": 0, "better": 1, "within_noise": 0, "changed": 0}
    assert got["differences"][0]["change"] == "better"


def test_a_2x_bandwidth_drop_is_worse_and_fails_with_its_band(tmp_path: Any,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path, "good.json", report(measurements={"all_reduce": _sweep(10.2)}))
    slow = _write(tmp_path, "slow.json", report(measurements={"all_reduce": _sweep(5.1)}))
    assert cli.main(["diff", good, slow]) == EXIT_FAILED
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("ddp-doctor diff: 1 worse; 0 better, 0 within noise")
    assert ("worse (1: the comparison fails, exit 3):\n  bus bandwidth:\n    all_reduce busbw at 64 MiB: 10.2 GB/s "
            "-> 5.1 GB/s (-50%, beyond this pair's noise band of -25%/+33%: the 25% floor for figures measured on CPU)"
            ) in out
    assert cli.main(["diff", "--json", good, slow]) == EXIT_FAILED
    got = json.loads(capsys.readouterr().out)
    assert got["worse"] is True
    assert got["differences"] == [{
        "kind": "bandwidth", "what": "all_reduce busbw at 64 MiB", "good": "10.2 GB/s", "bad": "5.1 GB/s",
        "change": "worse", "ratio": 0.5, "direction": "higher is better", "band": 0.25, "within_ratio": [0.75, 1.3333],
        "band_from": "the 25% floor for figures measured on CPU",
        "note": "-50%, beyond this pair's noise band of -25%/+33%: the 25% floor for figures measured on CPU"}]


def test_step_time_is_judged_the_other_way(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # lower is better: twice the step time is worse, half of it better, +20% within a CPU run's noise
    good = report(phase="training", measurements={"training": training(1.0)})
    for bad_s, change, rc in ((2.0, "worse", EXIT_FAILED), (0.5, "better", EXIT_OK), (1.2, "within_noise", EXIT_OK)):
        bad = report(phase="training", measurements={"training": training(bad_s)})
        [d] = diff_reports(good, bad).differences
        assert (d.kind, d.what, d.change, d.direction) == ("training", "median step time of train.py", change,
                                                          "lower is better"), d.line()
        assert cli.main(["diff", _write(tmp_path, "g.json", good), _write(tmp_path, "b.json", bad)]) == rc
        capsys.readouterr()
    [d] = diff_reports(good, report(phase="training", measurements={"training": training(2.0)})).differences
    assert d.line() == ("median step time of train.py: 1 s -> 2 s (+100%, beyond this pair's noise band of -25%/+33%: "
                        "the 25% floor for times measured on CPU)")
    # on GPUs the floor is 10%: +20% is worse
    gpu_good = on_gpus(report(phase="training", measurements={"training": training(1.0)}))
    gpu_bad = on_gpus(report(phase="training", measurements={"training": training(1.2)}))
    assert changes(gpu_good, gpu_bad) == [("median step time of train.py", "worse")]
    # another script, or a report without the figure: not compared, and said
    other = diff_reports(good, report(phase="training", measurements={"training": training(9.0, key="k2")}))
    assert other.differences == [] and other.not_compared == [
        "training step time: the runs ran different scripts or arguments (train.py, train.py)"]
    assert diff_reports(report(), good).not_compared == ["training step time: the GOOD report does not record it"]


def test_bandwidth_is_compared_at_the_largest_size_both_measured() -> None:
    bigger = _sweep(1.0) + [{**_sweep(1.0)[-1], "bytes": 256 << 20, "busbw_gbps": 9.0, "algbw_gbps": 9.0}]
    assert diff_reports(report(measurements={"all_reduce": bigger}), report()).differences == []
    inter = report(measurements={"all_reduce": _sweep(), "all_reduce_inter": _sweep(2.0)})
    assert lines(inter, report()) == ["bandwidth all_reduce_inter busbw: 2 GB/s at 64 MiB -> (not measured)"]


def test_wrong_results_are_worse_and_fewer_of_them_better() -> None:
    sweep = _sweep()
    sweep[0].update(correct=False, wrong=3, wrong_ranks=[1])
    wrong = report(measurements={"all_reduce": sweep})
    assert lines(report(), wrong) == ["bandwidth all_reduce results: correct -> WRONG at 1 of 2 size(s) (rank 1)"]
    assert changes(report(), wrong) == [("all_reduce results", "worse")]
    assert changes(wrong, report()) == [("all_reduce results", "better")]
    more = _sweep()
    more[0].update(correct=False, wrong=30, wrong_ranks=[0])
    assert changes(wrong, report(measurements={"all_reduce": more})) == [("all_reduce results", "worse")]


def test_verdicts_status_root_cause_and_findings() -> None:
    cause = _finding("DDP320")
    bad = report(status="fail", root_cause=cause,
                 findings=[_finding("DDP500", "info", "GPU checks not applicable"), cause,
                           _finding("DDP405", "warning", "a rank computes markedly slower than the others")])
    got = lines(report(), bad)
    assert got == ["verdict status: pass -> fail", "verdict root cause: (none) -> DDP320",
                   "verdict finding DDP320 Ranks missing at rendezvous: (absent) -> error",
                   "verdict finding DDP405 a rank computes markedly slower than the others: (absent) -> warning"]
    assert {d.change for d in diff_reports(report(), bad).differences} == {"worse"}
    running = report(status="running", phase="training", preflight_status="warn")
    assert lines(report(), running) == ["verdict status: pass -> running (preflight warn)"]
    # a run not finished is no verdict on the job: it differs, neither better nor worse
    assert changes(report(), running) == [("status", "changed")]


def test_a_new_error_finding_is_worse_and_fails(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    cause = _finding("DDP320")
    failed = report(status="fail", root_cause=cause, findings=[cause])
    good = _write(tmp_path, "good.json", report())
    bad = _write(tmp_path, "bad.json", failed)
    assert cli.main(["diff", good, bad]) == EXIT_FAILED
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("ddp-doctor diff: 3 worse;")
    assert ("worse (3: the comparison fails, exit 3):\n  verdict:\n    status: pass -> fail\n"
            "    root cause: (none) -> DDP320\n"
            "    finding DDP320 Ranks missing at rendezvous: (absent) -> error") in out
    # a new warning too, or one that became an error
    warned = report(status="warn", findings=[_finding("DDP405", "warning", "slow rank")])
    assert changes(report(), warned) == [("status", "worse"), ("finding DDP405 slow rank", "worse")]
    worse = report(status="fail", root_cause=_finding("DDP405"), findings=[_finding("DDP405", "error", "slow rank")])
    assert changes(warned, worse) == [("status", "worse"), ("root cause", "worse"),
                                      ("finding DDP405 slow rank", "worse")]


def test_a_finding_gone_or_less_severe_is_better_and_passes(tmp_path: Any,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    cause = _finding("DDP320")
    failed = report(status="fail", root_cause=cause, findings=[cause])
    assert cli.main(["diff", _write(tmp_path, "failed.json", failed), _write(tmp_path, "fixed.json", report())]) \
        == EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("ddp-doctor diff: nothing worse; 3 better,")
    assert ("better (3):\n  verdict:\n    status: fail -> pass\n    root cause: DDP320 -> (none)\n"
            "    finding DDP320 Ranks missing at rendezvous: error -> (absent)") in out
    warned = report(status="warn", findings=[_finding("DDP320", "warning")])
    assert changes(failed, warned) == [("status", "better"), ("root cause", "better"),
                                       ("finding DDP320 Ranks missing at rendezvous", "better")]
    # another root cause: it differs; the findings say which one came and which one went
    other = _finding("DDP301", title="Named network interface does not exist")
    assert changes(failed, report(status="fail", root_cause=other, findings=[other])) == [
        ("finding DDP301 Named network interface does not exist", "worse"),
        ("finding DDP320 Ranks missing at rendezvous", "better"), ("root cause", "changed")]


def test_worse_first_then_better_within_noise_and_settings_most_likely_first() -> None:
    # was: one list by kind; now what got worse comes first (it fails the command), then what got
    # better, what moved within noise, and last the settings that differ, each by kind, most likely first
    good = report(measurements={"all_reduce": _sweep(), "all_reduce_inter": _sweep(1.0),
                                "all_reduce_intra": _sweep(1.0)})
    bad = report(status="fail", root_cause=_finding("DDP320"), findings=[_finding("DDP320")],
                 measurements={"all_reduce": _sweep(0.1), "all_reduce_inter": _sweep(4.0),
                               "all_reduce_intra": _sweep(1.1)}, tool_version="0.2.0")
    bad["world"]["backend"] = "nccl"
    set_env(bad, "NCCL_ALGO", "Tree")
    set_env(bad, "MASTER_ADDR", "node-z")
    result = diff_reports(good, bad)
    got = [(d.change, d.kind) for d in result.differences]
    assert [c for c, _ in got] == ["worse"] * 4 + ["better", "within_noise"] + ["changed"] * 4
    order = [k for k, _ in KINDS]
    for change in ("worse", "changed"):
        kinds = [k for c, k in got if c == change]
        assert kinds == sorted(kinds, key=order.index)
    assert [k for c, k in got if c == "changed"] == ["versions", "nccl_env", "launcher_env", "world"]
    text = render_text(result, "good.json", "bad.json")
    assert text.splitlines()[0] == ("ddp-doctor diff: 4 worse; 1 better, 1 within noise, 4 other difference(s) - "
                                    "GOOD good.json, BAD bad.json")
    headings = [x.strip() for x in text.splitlines()[1:] if not x.startswith("    ")]
    assert headings == ["worse (4: the comparison fails, exit 3):", "bus bandwidth:", "verdict:",
                        "better (1):", "bus bandwidth:", "within noise (1):", "bus bandwidth:",
                        "also differs (4; neither better nor worse in itself: the likely causes, most likely first):",
                        "versions:", "NCCL/FI variables:", "launcher variables:", "world layout:"]


def test_parts_a_report_does_not_record_are_named_not_listed() -> None:
    bare = report()
    for entry in bare["ranks"]:
        del entry["versions"], entry["env"]
    result = diff_reports(bare, set_env(report(), "NCCL_SOCKET_IFNAME", "lo"))
    assert result.differences == []
    assert result.not_compared == [
        "library versions (torch, NCCL, CUDA, python): the GOOD report does not record them",
        "environment variables (NCCL_*, FI_*, launchers'): the GOOD report does not record them"]
    assert "not compared:" in render_text(result, "a", "b")


def test_secrets_are_never_shown() -> None:
    # a hand-made or older report whose values were not redacted: the diff still shows none of them
    good = set_env(report(), "HF_TOKEN", SECRET)
    set_env(good, "WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")
    bad = set_env(report(), "HF_TOKEN", SECRET[::-1])
    set_env(bad, "NCCL_NET_PLUGIN", f"https://user:{SECRET}@example.com/plugin")
    bad["ranks"][0]["host"] = SECRET
    result = diff_reports(good, bad)
    text = render_text(result, "good.json", "bad.json") + json.dumps(to_json(result, "good.json", "bad.json"))
    assert SECRET not in text and SECRET[::-1] not in text and "0123456789abcdef" not in text
    got = {d.what: (d.good, d.bad) for d in result.differences}
    assert got["WANDB_API_KEY"] == ("***", "(unset)")
    assert "HF_TOKEN" not in got  # both values are masked: the diff cannot tell them apart, and says nothing
    assert got["NCCL_NET_PLUGIN"][0] == "(unset)" and "***" in got["NCCL_NET_PLUGIN"][1]


def test_json_form() -> None:
    # was: "matters" (anything differs); now "worse" (what the exit status says), the counts per
    # change, and each item's change, and a figure's band
    bad = set_env(report(measurements={"all_reduce": _sweep(0.5)}), "NCCL_ALGO", "Tree")
    out = to_json(diff_reports(report(), bad), "g.json", "b.json")
    assert out["schema"] == "ddp-doctor.diff" and out["worse"] is True and "matters" not in out
    assert out["counts"] == {"worse": 1, "better": 0, "within_noise": 0, "changed": 1}
    assert out["differences"] == [
        {"kind": "bandwidth", "what": "all_reduce busbw at 64 MiB", "good": "1 GB/s", "bad": "0.5 GB/s",
         "change": "worse", "ratio": 0.5, "direction": "higher is better", "band": 0.25, "within_ratio": [0.75, 1.3333],
         "band_from": "the 25% floor for figures measured on CPU",
         "note": "-50%, beyond this pair's noise band of -25%/+33%: the 25% floor for figures measured on CPU"},
        {"kind": "nccl_env", "what": "NCCL_ALGO", "good": "(unset)", "bad": "Tree", "change": "changed"}]


@pytest.mark.parametrize("obj, says", [
    ([1, 2], "not a ddp-doctor report"),
    ({"schema": "something.else"}, "not a ddp-doctor report"),
    ({"schema": "ddp-doctor.report"}, "no schema_version"),
    ({**report(), "schema_version": 2}, "schema_version 2; this ddp-doctor reads 1"),
    ({**report(), "ranks": "all of them"}, "not a valid ddp-doctor report: $.ranks"),
])
def test_what_is_not_a_report(obj: Any, says: str) -> None:
    assert says in (report_problem(obj) or "")


# -- the command, on files ------------------------------------------------------------------------

def _write(tmp_path: Any, name: str, obj: Any) -> str:
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


def test_command_exit_status_and_text(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path, "good.json", report())
    same = _write(tmp_path, "same.json", report(world={**report()["world"], "master_port": 1}))
    other = _write(tmp_path, "other.json", set_env(report(), "NCCL_SOCKET_IFNAME", "lo"))
    assert cli.main(["diff", good, same]) == EXIT_OK
    assert capsys.readouterr().out.startswith("ddp-doctor diff: nothing worse; 0 better, 0 within noise, "
                                              "0 other difference(s)")
    # was exit 3: a variable that differs is listed, but it made nothing worse, and the exit status
    # says "worse", not "different"
    assert cli.main(["diff", good, other]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith("ddp-doctor diff: nothing worse; 0 better, 0 within noise, 1 other difference(s)")
    assert "NCCL/FI variables:\n    NCCL_SOCKET_IFNAME: (unset) -> lo\n" in out
    assert cli.main(["diff", "--json", good, other]) == EXIT_OK
    assert [(d["what"], d["change"]) for d in json.loads(capsys.readouterr().out)["differences"]] == [
        ("NCCL_SOCKET_IFNAME", "changed")]
    slow = _write(tmp_path, "slow.json", report(measurements={"all_reduce": _sweep(0.4)}))
    assert cli.main(["diff", good, slow]) == EXIT_FAILED
    assert cli.main(["diff", "--bw-tolerance", "70%", good, slow]) == EXIT_OK


@pytest.mark.invalid_reports_expected  # a report whose status breaks the schema, on purpose
@pytest.mark.parametrize("content, says", [
    (None, "cannot read"),
    ("", "not JSON"),
    ("\x00\xff garbage", "not JSON"),
    ('{"a": 1}', "not a ddp-doctor report"),
    (json.dumps({**report(), "status": "great"}), "not a valid ddp-doctor report"),
])
def test_command_usage_errors_are_one_line(tmp_path: Any, capsys: pytest.CaptureFixture[str],
                                           content: str | None, says: str) -> None:
    good = _write(tmp_path, "good.json", report())
    other = str(tmp_path / "other.json") if content is None else _write(tmp_path, "other.json", content)
    assert cli.main(["diff", good, other]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith("ddp-doctor diff: error: ") and other in line and says in line


def test_a_directory_is_a_usage_error(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["diff", str(tmp_path), str(tmp_path)]) == EXIT_USAGE
    assert "cannot read" in capsys.readouterr().err


def test_report_is_not_changed(tmp_path: Any) -> None:
    good, bad = report(), set_env(report(), "NCCL_SOCKET_IFNAME", "lo")
    before = copy.deepcopy((good, bad))
    diff_reports(good, bad)
    assert (good, bad) == before
