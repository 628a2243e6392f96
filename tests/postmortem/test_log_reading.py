"""The post-mortem's readers, line by line (postmortem/log_lines.py, rank_text.py,
launcher_text.py): each launcher's rank prefix, a rank's ending among its other lines, torchrun's
summary. The lines are as the launchers print them (torchrun and torch 2.13 here; Open MPI's
--tag-output and SageMaker's MPI prefix as their documentation and CloudWatch streams show them)."""
from __future__ import annotations

import pytest

from ddp_doctor.postmortem.launcher_text import LauncherText
from ddp_doctor.postmortem.log_lines import split_prefix, srun_labelled
from ddp_doctor.postmortem.rank_text import RankText


@pytest.mark.parametrize("raw,rank,local,host,text", [
    ("[default3]:[rank11]: Traceback (most recent call last):", 11, 3, None, "Traceback (most recent call last):"),
    ("[default3]:loss 0.5", None, 3, None, "loss 0.5"),
    ("[trainer0]:step 1", None, 0, None, "step 1"),
    ("[rank5]: ValueError: x", 5, None, None, "ValueError: x"),
    ("[1,3]<stderr>:RuntimeError: boom", 3, None, None, "RuntimeError: boom"),
    ("[1,mpirank:7,algo-2]<stdout>:epoch 1", 7, None, "algo-2", "epoch 1"),
    ("W1124 21:20:12.819000 32172 site-packages/torch/distributed/elastic/api.py:1028] Sending", None, None, None,
     "W1124 21:20:12.819000 32172 site-packages/torch/distributed/elastic/api.py:1028] Sending"),
    ("12: not a label unless the file is labelled", None, None, None, "12: not a label unless the file is labelled"),
])
def test_each_launchers_prefix_names_the_rank(raw, rank, local, host, text):
    line = split_prefix(raw + "\n")
    assert (line.rank, line.local_rank, line.host, line.text) == (rank, local, host, text)


def test_srun_labels_are_taken_only_in_a_labelled_file():
    labelled = ["0: start\n", "1: start\n", "1: Traceback (most recent call last):\n", "0: done\n"]
    assert srun_labelled(labelled)
    assert split_prefix(labelled[2], srun_labelled=True).rank == 1
    assert not srun_labelled(["epoch 1\n", "12: a numbered line\n", "loss 3\n", "done\n"])


def _read(lines: list[str]) -> RankText:
    t = RankText()
    for i, ln in enumerate(lines):
        t.feed(ln, i)
    t.finish()
    return t


CHAINED = [
    "Traceback (most recent call last):",
    '  File "/job/train.py", line 9, in load',
    "    raise KeyError('shard')",
    "KeyError: 'shard'",
    "",
    "The above exception was the direct cause of the following exception:",
    "",
    "Traceback (most recent call last):",
    '  File "/job/train.py", line 12, in <module>',
    "    load()",
    "RuntimeError: could not load the shard",
    "on node algo-2",
]


def test_the_last_chained_traceback_ends_the_rank_with_its_whole_chain_and_message():
    t = _read(["step 1", *CHAINED, "W1124 21:20:12.8 1 api.py:1] Sending process 5 closing signal SIGTERM"])
    exc = t.exception()
    assert exc["type"] == "RuntimeError" and exc["message"] == "could not load the shard\non node algo-2"
    assert "KeyError: 'shard'" in exc["traceback"] and "direct cause" in exc["traceback"]


def test_a_logged_traceback_the_training_survived_is_not_the_ending():
    t = _read([*CHAINED[:4], "", *[f"step {i} loss 0.1" for i in range(40)]])
    assert t.exception() is None and t.tail[-1] == "step 39 loss 0.1"


def test_faulthandlers_dump_is_the_crash_with_its_signal():
    t = _read(["step 3", "Fatal Python error: Segmentation fault", "",
               "Current thread 0x00007f (most recent call first):",
               '  File "/job/train.py", line 10 in <module>', "", "", "more"])
    dump, _, status = t.dump
    assert status == -11 and 'File "/job/train.py", line 10 in <module>' in dump and t.exception() is None


def test_torchruns_summary_gives_each_failed_rank_and_the_first():
    lt = LauncherText()
    for ln in """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-24_21:20:13
  host      : algo-1
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 32767)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 32767
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-24_21:20:12
  host      : algo-2
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 300)
  error_file: /tmp/t/attempt_0/1/error.json
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================""".splitlines():
        lt.feed(ln)
    lt.finish()
    first, other = lt.exits[3], lt.exits[0]
    assert (first.root_cause, first.local_rank, first.host, first.exit_code) == (True, 1, "algo-2", 1)
    assert first.error_file == "/tmp/t/attempt_0/1/error.json" and other.exit_code == -15 and not other.root_cause
    assert other.time - first.time == 1.0


def test_open_mpis_summary_gives_the_first_rank_to_fail():
    lt = LauncherText()
    for ln in ["--------------------------------------------------------------------------",
               "mpirun detected that one or more processes exited with non-zero status, thus causing",
               "the job to be terminated. The first process to do so was:", "",
               "  Process name: [[9479,1],3]", "  Exit code:    2",
               "--------------------------------------------------------------------------"]:
        lt.feed(ln)
    lt.finish()
    assert lt.launcher == "mpirun" and lt.exits[3].exit_code == 2 and lt.exits[3].root_cause


def test_the_summary_quotes_the_ranks_own_traceback_when_its_error_file_had_one():
    lt = LauncherText()
    for ln in ["Root Cause (first observed failure):", "[0]:", "  time      : 2026-11-24_22:10:43",
               "  rank      : 1 (local_rank: 1)", "  exitcode  : 1 (pid: 300)",
               "  error_file: /tmp/logs/run_x/attempt_0/1/error.json",
               "  traceback : Traceback (most recent call last):",
               '    File "/job/train.py", line 7, in <module>', "      raise ValueError('bad batch')",
               "  ValueError: bad batch on rank 1", "  ", "====================================="]:
        lt.feed(ln)
    lt.finish()
    tb = lt.exits[1].traceback
    assert tb.startswith("Traceback (most recent call last):") and "ValueError: bad batch on rank 1" in tb
