"""A large log is scanned, not read line by line (postmortem/large_text.py), and must say what the
line-by-line reading says: the same ending for every rank (a chained traceback in the middle of
the console, a traceback the training survived, a faulthandler dump near the end), the same
launcher summary, the same verdict."""
from __future__ import annotations

import random

import pytest

from ddp_doctor.postmortem import inputs
from ddp_doctor.postmortem.analyze import analyze

RANKS = 8


def _console(path, filler_lines: int) -> None:
    rnd = random.Random(7)
    out = []

    def step(n: int) -> None:
        for i in range(n):
            r = rnd.randrange(RANKS)
            out.append(f"[default{r}]:step {i} loss {rnd.random():.5f} lr 0.001 grad_norm 1.23 samples/s 812.4\n")

    step(filler_lines)
    # rank 2: a traceback a logger printed; its training went on for many lines
    logged = ("Traceback (most recent call last):", '  File "/job/data.py", line 5, in get',
              "OSError: [Errno 5] retrying shard 3")
    out += [f"[default2]:{ln}\n" for ln in logged]
    out += [f"[default2]:step {i} after the retry\n" for i in range(60)]
    step(filler_lines)
    # rank 5: the chain that ended it
    chain = ["Traceback (most recent call last):", '  File "/job/train.py", line 9, in load',
             "    raise KeyError('shard')", "KeyError: 'shard'", "",
             "The above exception was the direct cause of the following exception:", "",
             "Traceback (most recent call last):", '  File "/job/train.py", line 12, in <module>', "    load()",
             "RuntimeError: could not load shard 9 on rank 5"]
    for i, ln in enumerate(chain):
        out.append(f"[default5]:[rank5]: {ln}\n")
        if i % 3 == 0:
            step(2)  # other ranks' lines interleave
    step(filler_lines // 4)
    for r in range(RANKS):
        if r not in (5, 7):
            out.append(f"[default{r}]:[rank{r}]: RuntimeError: Connection closed by peer [127.0.0.1]:2950{r}\n")
    out += [f"[default7]:{ln}\n" for ln in ("Fatal Python error: Segmentation fault", "",
                                            "Current thread 0x00007f (most recent call first):",
                                            '  File "/job/model.py", line 41 in forward', "")]
    out.append("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n====\ntrain.py FAILED\n----\n"
               "Failures:\n[1]:\n  time      : 2026-11-24_03:00:01\n  host      : algo-1\n"
               "  rank      : 7 (local_rank: 7)\n  exitcode  : -11 (pid: 77)\n  error_file: <N/A>\n"
               "  traceback : Signal 11 (SIGSEGV) received by PID 77\n----\nRoot Cause (first observed failure):\n"
               "[0]:\n  time      : 2026-11-24_03:00:00\n  host      : algo-1\n  rank      : 5 (local_rank: 5)\n"
               "  exitcode  : 1 (pid: 55)\n  error_file: <N/A>\n  traceback : To enable traceback see: x\n====\n")
    path.write_text("".join(out))


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    path = tmp_path_factory.mktemp("large") / "console.log"
    _console(path, 40_000)  # ~6 MB: past SMALL_FILE
    assert path.stat().st_size > inputs.SMALL_FILE
    return path


def _verdict(rep: dict) -> tuple:
    pm = rep["measurements"]["post_mortem"]["ranks"]
    return (rep["root_cause"]["id"], rep["root_cause"]["ranks"], rep["root_cause"]["message"],
            {r: (v["ended"], v.get("error"), v.get("exit_status")) for r, v in pm.items()},
            sorted((f["id"], tuple(f["ranks"]), f["severity"]) for f in rep["findings"]))


def test_the_scan_of_a_large_console_says_what_reading_it_line_by_line_says(console, monkeypatch):
    scanned, _ = analyze([str(console)])
    monkeypatch.setattr(inputs, "SMALL_FILE", 1 << 40)
    read, _ = analyze([str(console)])
    assert _verdict(scanned) == _verdict(read)
    ranks = scanned["measurements"]["post_mortem"]["ranks"]
    cause = scanned["root_cause"]
    assert cause["ranks"] == [5] and "could not load shard 9 on rank 5" in cause["message"]
    assert ranks["2"]["ended"] != "raised"  # the traceback it survived is not its ending
    assert ranks["7"]["ended"] == "crashed" and ranks["7"]["exit_status"] == -11
    crash = next(f for f in scanned["findings"] if f["id"] == "DDP807")
    assert "/job/model.py:41 in forward" in crash["message"]
