"""What analyze reads, found by content (postmortem/inputs.py): several jobs' trees in one
directory, a job's restarts, per-rank files, stdin, dumps of another torch version. Built from
small artifacts shaped as torchrun and torch write them (tests/postmortem/test_analyze_recorded.py
reads what the real launchers left, test_analyze_e2e.py runs them)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ddp_doctor.postmortem.analyze import analyze

RAISED = ["Traceback (most recent call last):", '  File "/job/train.py", line 7, in <module>',
          "    raise ValueError('bad batch')", "ValueError: bad batch on rank {r}"]
LOST = ["Traceback (most recent call last):", '  File "/job/train.py", line 9, in <module>',
        "    dist.all_reduce(t)", "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:29500"]


def _tree(root, run: str, attempt: int, lines: dict[int, list[str]], mtime: float) -> None:
    for local, text in lines.items():
        d = root / run / f"attempt_{attempt}" / str(local)
        d.mkdir(parents=True)
        (d / "stdout.log").write_text("")
        (d / "stderr.log").write_text("".join(f"[rank{local}]: {ln.format(r=local)}\n" for ln in text))
        for f in d.iterdir():
            os.utime(f, (mtime, mtime))


def _cause(rep: dict) -> tuple:
    c = rep["root_cause"]
    return (c["id"], c["ranks"]) if c else None


def test_several_jobs_in_one_directory_the_newest_is_read_and_the_others_named(tmp_path):
    _tree(tmp_path, "old-job_ab12", 0, {0: RAISED, 1: LOST}, 1_700_000_000)
    _tree(tmp_path, "new-job_cd34", 0, {0: LOST, 1: RAISED}, 1_700_100_000)
    rep, _ = analyze([str(tmp_path)])
    assert _cause(rep) == ("DDP800", [1]), rep["findings"]
    (several,) = [f for f in rep["findings"] if f["id"] == "DDP954"]
    assert several["evidence"] == {"read": "new-job", "not_read": ["old-job"]}
    assert rep["world"]["run_id"] == "new-job"


def test_a_restarted_job_is_judged_by_its_last_attempt(tmp_path):
    _tree(tmp_path, "job_ab12", 0, {0: RAISED, 1: LOST}, 1_700_000_000)
    _tree(tmp_path, "job_ab12", 1, {0: LOST, 1: RAISED}, 1_700_000_100)
    rep, _ = analyze([str(tmp_path)])
    assert _cause(rep) == ("DDP800", [1]) and rep["world"]["attempts"] == 2, rep["findings"]
    assert not [f for f in rep["findings"] if f["id"] == "DDP954"]


@pytest.mark.slow
def test_per_rank_files_and_stdin(tmp_path):
    (tmp_path / "train_rank_0.log").write_text("\n".join(["step 1", *LOST]) + "\n")
    (tmp_path / "train_rank_1.log").write_text("\n".join(["step 1", *(ln.format(r=1) for ln in RAISED)]) + "\n")
    rep, _ = analyze([str(tmp_path)])
    assert _cause(rep) == ("DDP800", [1]), rep["findings"]
    console = "".join(f"[1,{r}]<stderr>:{ln.format(r=r)}\n" for r, text in ((1, RAISED), (0, LOST)) for ln in text)
    out = subprocess.run([sys.executable, "-m", "ddp_doctor", "analyze", "-", "--json"], input=console,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and _cause(json.loads(out.stdout)) == ("DDP800", [1]), out.stderr


def test_a_dump_of_another_torch_version_is_read_or_named_never_a_traceback(tmp_path):
    """Entries with fields this torch does not write, others missing, an unknown version: the
    verdict stands on what is there; a dump that is not a dict of entries is named as unread."""
    (tmp_path / "console.log").write_text("".join(f"[rank1]: {ln.format(r=1)}\n" for ln in RAISED))
    (tmp_path / "nccl_trace_rank_0").write_text(json.dumps({"version": "9.9", "pg_config": "not a dict", "entries": [
        {"record_id": 0, "profiling_name": "nccl:all_reduce", "future_field": [1, 2], "collective_seq_id": "x"},
        {"frames": "not a list", "retired": None}, "not an entry"]}))
    (tmp_path / "nccl_trace_rank_1").write_text(json.dumps({"entries": "not a list"}))
    rep, _ = analyze([str(tmp_path)])
    assert _cause(rep) == ("DDP800", [1]), rep["findings"]
    (unread,) = [f for f in rep["findings"] if f["id"] == "DDP951"]
    assert [os.path.basename(s["path"]) for s in unread["evidence"]["skipped"]] == ["nccl_trace_rank_1"]


def test_one_process_console_is_rank_0_of_1_and_a_launchers_console_is_not(tmp_path):
    """`python train.py > log`: no rank prefix and no launcher summary, so its lines are its one
    process's. torchrun's console under --redirects has no prefix either, but its summary makes its
    lines the launcher's (its own ChildFailedError traceback is never a rank's error)."""
    (tmp_path / "alone").mkdir()
    (tmp_path / "alone" / "train.log").write_text("epoch 1\n" + "\n".join(ln.format(r=0) for ln in RAISED) + "\n")
    rep, _ = analyze([str(tmp_path / "alone")])
    assert _cause(rep) == ("DDP800", [0]) and rep["world"]["world_size"] == 1, rep["findings"]
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "console.log").write_text(
        "Traceback (most recent call last):\n  File \"/usr/bin/torchrun\", line 8, in <module>\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n====\ntrain.py FAILED\n----\n"
        "Failures:\n  <NO_OTHER_FAILURES>\n----\nRoot Cause (first observed failure):\n[0]:\n"
        "  time      : 2026-11-24_03:00:00\n  host      : algo-1\n  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : 1 (pid: 4242)\n  error_file: <N/A>\n  traceback : To enable traceback see: x\n====\n")
    rep, _ = analyze([str(tmp_path / "agent")])
    assert _cause(rep) == ("DDP803", [1]) and "ChildFailedError" not in rep["root_cause"]["message"], rep


def _summary(rank: int, code: int) -> str:
    return ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n====\ntrain.py FAILED\n----\n"
            "Failures:\n  <NO_OTHER_FAILURES>\n----\nRoot Cause (first observed failure):\n[0]:\n"
            f"  time      : 2026-11-24_03:00:00\n  host      : algo-1\n  rank      : {rank} (local_rank: {rank})\n"
            f"  exitcode  : {code} (pid: 4242)\n  error_file: <N/A>\n  traceback : To enable traceback see: x\n====\n")


def test_a_status_of_its_own_and_no_python_error_is_the_script_ending_itself(tmp_path):
    """A rank that printed, then exited with 2 and no traceback (argparse's exit, a sys.exit(2)):
    its script ended itself (DDP814, as run says it); its peer's lost-peer error is a consequence.
    128 + N is a signal's status (a shell's or mpirun's way): never read as the script's own."""
    lines = "[rank1]:step 3\n[rank1]:train.py: error: unrecognized arguments: --bogus\n"
    lines += "".join(f"[rank0]:{ln}\n" for ln in LOST)
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "console.log").write_text(lines + _summary(1, 2))
    rep, _ = analyze([str(tmp_path / "own")])
    assert _cause(rep) == ("DDP814", [1]), rep["findings"]
    assert "exited with status 2 and no Python error in the output" in rep["root_cause"]["message"]
    assert rep["root_cause"]["evidence"]["last_line"].endswith("unrecognized arguments: --bogus")
    (tmp_path / "signal").mkdir()
    (tmp_path / "signal" / "console.log").write_text(lines + _summary(1, 137))
    rep, _ = analyze([str(tmp_path / "signal")])
    assert _cause(rep) == ("DDP803", [1]) and "128 + " in rep["root_cause"]["message"], rep["findings"]


@pytest.mark.parametrize("code", [-6, 134])
def test_the_teardown_abort_after_an_ending_of_its_own_is_the_script_ending_itself(tmp_path, code):
    """torch's gloo can abort as the interpreter exits ("terminate called without an active
    exception", SIGABRT), replacing the status a rank's sys.exit(N) asked for: the script had ended
    itself (DDP814, as run says it, its status said lost), never a crash in its code (DDP807). The
    line may come before the rank's last print (two streams); it is never quoted as its last line."""
    lines = "[rank1]:terminate called without an active exception\n[rank1]:rank 1: no more data, stopping\n"
    lines += "".join(f"[rank0]:{ln}\n" for ln in LOST)
    (tmp_path / "console.log").write_text(lines + _summary(1, code))
    rep, _ = analyze([str(tmp_path)])
    assert _cause(rep) == ("DDP814", [1]), rep["findings"]
    root = rep["root_cause"]
    assert "lost to the abort" in root["message"] and root["evidence"]["aborted_at_exit"] is True, root
    assert root["evidence"]["last_line"] == "rank 1: no more data, stopping", root
    assert "DDP807" not in {f["id"] for f in rep["findings"]}, rep["findings"]
    # without the line, a SIGABRT is a crash in native code, as before
    (tmp_path / "console.log").write_text(lines.split("\n", 1)[1] + _summary(1, -6))
    rep, _ = analyze([str(tmp_path)])
    assert _cause(rep) == ("DDP807", [1]), rep["findings"]


def _console(path, lines: dict[int, list[str]], *, host: str, pids: dict[int, int], mtime: float,
             failed: int, code: int = 1, base: int = 0) -> None:
    """A torchrun console of one node: its ranks' lines (local prefixes) and its summary."""
    text = "".join(f"[default{local}]:{ln.format(r=base + local)}\n" for local, ls in lines.items() for ln in ls)
    text += "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n====\ntrain.py FAILED\n----\n"
    text += "Failures:\n  <NO_OTHER_FAILURES>\n----\nRoot Cause (first observed failure):\n[0]:\n"
    text += (f"  time      : 2026-11-24_03:00:00\n  host      : {host}\n  rank      : {base + failed} (local_rank: "
             f"{failed})\n  exitcode  : {code} (pid: {pids[failed]})\n  error_file: <N/A>\n"
             "  traceback : To enable traceback see: x\n====\n")
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def test_consoles_of_two_jobs_are_kept_apart_the_newest_read_and_the_other_named(tmp_path):
    """Two runs of one script saved side by side: the same local ranks, different output. Read
    together they would make one rank of two processes; the newest is read, the other named."""
    _console(tmp_path / "run-a.log", {0: ["step 1", *RAISED], 1: ["step 1", *LOST]}, host="box", pids={0: 11},
             mtime=1_700_000_000, failed=0)
    _console(tmp_path / "run-b.log", {0: ["step 1", *LOST], 1: ["step 1", "step 2", *RAISED]}, host="box",
             pids={1: 22}, mtime=1_700_100_000, failed=1)
    rep, _ = analyze([str(tmp_path)])
    assert _cause(rep) == ("DDP800", [1]), rep["findings"]
    (several,) = [f for f in rep["findings"] if f["id"] == "DDP954"]
    assert [os.path.basename(p) for p in several["evidence"]["read"]] == ["run-b.log"]
    assert [os.path.basename(p) for p in several["evidence"]["not_read"]] == ["run-a.log"]
    # a rerun whose ranks printed the same lines is told apart by the pids torchrun's summary gives
    _console(tmp_path / "run-a.log", {0: ["step 1", *LOST], 1: ["step 1", "step 2", *RAISED]}, host="box",
             pids={1: 11}, mtime=1_700_000_000, failed=1)
    rep, _ = analyze([str(tmp_path)])
    (several,) = [f for f in rep["findings"] if f["id"] == "DDP954"]
    assert [os.path.basename(p) for p in several["evidence"]["not_read"]] == ["run-a.log"]


def test_consoles_of_one_jobs_nodes_and_a_copy_are_read_as_one_job(tmp_path):
    """Two nodes' consoles (the same local ranks, on hosts their summaries name apart) are one
    job; a console saved twice is read once, and the copy named as not read."""
    _console(tmp_path / "node0.log", {0: ["step 1", *LOST], 1: ["step 1", *LOST]}, host="algo-1",
             pids={0: 11}, mtime=1_700_000_000, failed=0, code=-15)
    _console(tmp_path / "node1.log", {0: ["step 1", "step 2", *RAISED], 1: ["step 1", *LOST]}, host="algo-2",
             pids={0: 22}, mtime=1_700_000_010, failed=0, base=2)
    rep, _ = analyze([str(tmp_path)])
    assert not [f for f in rep["findings"] if f["id"] == "DDP954"], rep["findings"]
    (tmp_path / "node1-copy.log").write_text((tmp_path / "node1.log").read_text())
    os.utime(tmp_path / "node1-copy.log", (1_700_000_005, 1_700_000_005))
    rep, _ = analyze([str(tmp_path)])
    assert not [f for f in rep["findings"] if f["id"] == "DDP954"], rep["findings"]
    (copy,) = [f for f in rep["findings"] if f["id"] == "DDP951"]
    assert "a copy of" in str(copy["evidence"]) and "node1-copy.log" in str(copy["evidence"]), copy
    # global prefixes ([rank2]: on the second node) hold different ranks: never two jobs
    g = tmp_path / "global"
    g.mkdir()
    (g / "a.log").write_text("".join(f"[rank{r}]:step 1\n" for r in (0, 1)))
    (g / "b.log").write_text("".join(f"[rank{r}]:step 1\n" for r in (2, 3)) + "".join(
        f"[rank3]:{ln.format(r=3)}\n" for ln in RAISED))
    rep, _ = analyze([str(g)])
    assert _cause(rep) == ("DDP800", [3]) and not [f for f in rep["findings"] if f["id"] == "DDP954"], rep


STOPPED = """*****************************************
Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded
*****************************************
[default0]:step 40 loss 0.52
[default1]:step 40 loss 0.51
W1125 00:51:55.080000 2210 site-packages/torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, shutting down workers
W1125 00:51:55.081000 2210 site-packages/torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 2255 closing signal SIGTERM
Traceback (most recent call last):
  File "/usr/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
  File "/usr/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 923, in _invoke_run
    time.sleep(monitor_interval)
  File "/usr/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 2210 got signal: 15
"""  # noqa: E501 - torchrun's lines as it printed them, when `kill -TERM` reached its agent


def test_a_launcher_stopped_by_a_signal_is_an_interrupted_job_never_a_ranks_error(tmp_path):
    """torchrun stopped by SIGTERM (a stopped SageMaker job, a time limit) prints no summary: its own
    SignalException is the launcher's, not a rank's (nor a lone process's); the job was interrupted
    (DDP808, as run reports it), each rank where its output left it, and no "no failure found"."""
    (tmp_path / "console.log").write_text(STOPPED)
    rep, _ = analyze([str(tmp_path)])
    assert rep["status"] == "interrupted" and _cause(rep) == ("DDP808", [0, 1]), rep["findings"]
    msg = rep["root_cause"]["message"]
    assert "stopped by SIGTERM to torchrun's agent (pid 2210)" in msg and "'step 40 loss 0.51'" in msg, msg
    assert not {"DDP800", "DDP952", "DDP953"} & {f["id"] for f in rep["findings"]}, rep["findings"]
    # the same agent lines alone (its ranks printed nothing): still the launcher's, not rank 0 of 1
    (tmp_path / "console.log").write_text("\n".join(ln for ln in STOPPED.splitlines() if "[default" not in ln))
    rep, _ = analyze([str(tmp_path)])
    assert not [f for f in rep["findings"] if f["id"] == "DDP800"], rep["findings"]
    # a lone process whose traceback passes through torch's elastic code (@record) stays rank 0 of 1
    lone = "".join(ln + "\n" for ln in RAISED[:2]) + (
        '  File "/usr/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", '
        "line 367, in wrapper\n") + "".join(ln.format(r=0) + "\n" for ln in RAISED[2:])
    (tmp_path / "console.log").write_text(lone)
    rep, _ = analyze([str(tmp_path)])
    assert _cause(rep) == ("DDP800", [0]), rep["findings"]


def test_a_plain_torchrun_log_stopped_after_its_steps_says_they_ran_and_analyze_exits_3(tmp_path):
    """Plain torchrun prints the ranks' lines without a prefix: stopped by `timeout` after ten steps,
    the job is never said to have been stopped "before any rank started its script", and analyze's
    exit status is its own (3: a failure found), not the stopped job's 143."""
    import re
    plain = re.sub(r"^\[default\d\]:", "", STOPPED, flags=re.M)
    (tmp_path / "console.log").write_text(plain)
    rep, _ = analyze([str(tmp_path)])
    msg = rep["root_cause"]["message"]
    assert rep["status"] == "interrupted" and rep["root_cause"]["id"] == "DDP808", rep["findings"]
    assert "before any rank started" not in msg and "'step 40 loss 0.51'" in msg and "name no rank" in msg, msg
    out = subprocess.run([sys.executable, "-m", "ddp_doctor", "analyze", str(tmp_path / "console.log")],
                         capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert out.returncode == 3 and "DDP808" in out.stdout, (out.returncode, out.stdout, out.stderr[-2000:])


def test_a_rank_that_never_issued_the_collective_is_placed_at_its_outputs_last_line(tmp_path):
    """A dump says which collectives a rank issued, not where it is: the rank the others waited
    for is placed where its own output left it."""
    def entry(seq: int, t: int, retired: bool) -> dict:
        return {"record_id": seq - 1, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
                "profiling_name": "gloo:all_reduce", "input_sizes": [[4]], "input_dtypes": ["Float"],
                "output_sizes": [[4]], "output_dtypes": ["Float"], "state": "completed" if retired else "scheduled",
                "retired": retired, "time_created_ns": t, "is_p2p": False}
    (tmp_path / "nccl_trace_rank_0").write_text(json.dumps({"version": "2.10", "entries": [
        entry(1, 1_700_000_000_000_000_000, True), entry(2, 1_700_000_001_000_000_000, False)]}))
    (tmp_path / "nccl_trace_rank_1").write_text(json.dumps({"version": "2.10", "entries": [
        entry(1, 1_700_000_000_000_000_000, True)]}))
    timeout = "RuntimeError: [pair.cc:553] Timed out waiting 8000ms for recv operation to complete"
    (tmp_path / "console.log").write_text(
        "[rank1]:step 1\n[rank1]:saving checkpoint shard 3 of 8\n[rank0]:step 1\n"
        "[rank0]:Traceback (most recent call last):\n[rank0]:  File \"/job/train.py\", line 9, in <module>\n"
        f"[rank0]:    dist.all_reduce(t)\n[rank0]:{timeout}\n")
    rep, _ = analyze([str(tmp_path)])
    assert _cause(rep) == ("DDP891", [1]), rep["findings"]
    assert "it is at its output's last line: 'saving checkpoint shard 3 of 8'" in rep["root_cause"]["message"], rep
