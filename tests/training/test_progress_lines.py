"""Progress lines while ddp-doctor waits (training/run/hang_lines.py, preflight_ranks/stage_lines.py,
processes/progress.py): when a line is due and what it says, on heartbeat dicts and a clock the test
gives."""
from __future__ import annotations

import io

import pytest

from ddp_doctor.preflight_ranks.stage_lines import StageLines
from ddp_doctor.processes.launch_dir import note_stage, read_stages
from ddp_doctor.processes.progress import enabled, say
from ddp_doctor.training.run.hang_bound import FLOOR, SLOW_RANK_LIMIT, HangBound
from ddp_doctor.training.run.hang_lines import HangLines, place

T0 = 10_000.0


def hb(stalled_at: float = T0, *, where: str | None = "/home/u/job/train.py:12 in main",
       in_collective: bool = False, steps: int = 100, slowest: float = 1.0) -> dict:
    return {"last_progress": stalled_at, "steps": steps, "slowest_step": slowest, "where": where,
            "in_collective": in_collective}


def lines_over(rule: HangLines, beats: dict, times: list[float]) -> list[tuple[float, str]]:
    return [(t, line) for t in times if (line := rule.due(beats, T0 + t))]


def test_a_line_at_each_fifth_of_a_fixed_bound_then_the_verdict():
    rule = HangLines(HangBound(300.0))
    beats = {0: hb(T0 + 1000), 1: hb(T0)}  # rank 0 keeps moving (its last progress is "now")
    got = lines_over(rule, beats, [float(t) for t in range(0, 300, 5)])
    assert [t for t, _ in got] == [60.0, 120.0, 180.0, 240.0]
    assert got[0][1] == ("ddp-doctor: rank 1 has made no progress for 60 s, at train.py:12 in main; "
                         "the job is ended at 300 s unless it moves")
    assert "for 240 s" in got[-1][1]


def test_a_late_poll_gives_one_line_not_one_per_missed_step():
    rule = HangLines(HangBound(300.0))
    beats = {1: hb(T0)}
    assert rule.due(beats, T0 + 59) is None
    assert "for 190 s" in rule.due(beats, T0 + 190)  # steps 1..3 at once: one line
    assert rule.due(beats, T0 + 200) is None
    assert rule.due(beats, T0 + 241) is not None


def test_ranks_reaching_a_step_together_share_a_line_with_each_place():
    rule = HangLines(HangBound(6.0))
    beats = {0: hb(T0, where="/x/rank1_sleeps.py:10 in <module>", in_collective=True),
             1: hb(T0, where="/x/rank1_sleeps.py:9 in <module>")}
    line = rule.due(beats, T0 + 1.3)
    assert line == ("ddp-doctor: ranks 0, 1 have made no progress for 1.3 s, rank 0 at rank1_sleeps.py:10 in "
                    "<module>, in a collective; rank 1 at rank1_sleeps.py:9 in <module>; the job is ended at 6 s "
                    "unless they move")


def test_a_rank_that_moves_starts_over():
    rule = HangLines(HangBound(10.0))
    assert rule.due({1: hb(T0)}, T0 + 2) is not None
    assert rule.due({1: hb(T0 + 3)}, T0 + 3.5) is None  # it moved
    assert "for 2.0 s" in rule.due({1: hb(T0 + 3)}, T0 + 5)  # its first step again


def test_the_adaptive_bound_is_the_one_stated():
    rule = HangLines(HangBound())
    line = rule.due({0: hb(T0, steps=100, slowest=1.0)}, T0 + FLOOR / 5)
    assert line is not None and f"ended at {FLOOR:g} s" in line


def test_ranks_waiting_for_a_rank_that_still_works_are_ended_at_the_slow_rank_limit():
    rule = HangLines(HangBound())
    beats = {0: hb(T0 + 300), 1: hb(T0, in_collective=True)}  # rank 0 checkpoints, rank 1 waits for it
    assert rule.due(beats, T0 + 300) is None  # past a fifth of FLOOR, not of the slow-rank limit
    beats[0] = hb(T0 + SLOW_RANK_LIMIT / 5)
    line = rule.due(beats, T0 + SLOW_RANK_LIMIT / 5)
    assert line is not None and "rank 1 has" in line and f"ended at {SLOW_RANK_LIMIT:g} s" in line
    assert "waiting for a rank that still works" in line


def test_many_ranks_are_counted_not_listed():
    rule = HangLines(HangBound(5.0))
    line = rule.due({r: hb(T0) for r in range(64)}, T0 + 1)
    assert "ranks 0, 1, 2, 3 and 60 more have" in line
    assert line.count(" at train.py:12") == 4


def test_place_is_short_and_says_when_not_known():
    assert place({"where": "/a/b/train.py:7 in step", "in_collective": True}) == "train.py:7 in step, in a collective"
    assert place({"where": None, "innermost": None}) == "place not known yet"


def test_lines_are_redacted_and_a_closed_stream_takes_nothing(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz0123")
    out = io.StringIO()
    say("ddp-doctor: rank 0 at /tmp/hf_abcdefghijklmnopqrstuvwxyz0123/t.py:1", out)
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in out.getvalue() and out.getvalue().endswith("\n")
    out.close()
    say("anything", out)  # raises nothing


@pytest.mark.parametrize(("flag", "env", "want"), [
    (None, {}, True),  # a terminal or a CI log: on (the lines come only when a wait grows long)
    (True, {}, True),  # --progress
    (False, {}, False),  # --no-progress, --quiet
    (None, {"DDP_DOCTOR_PROGRESS": "1"}, True),
    (None, {"DDP_DOCTOR_PROGRESS": "0"}, False),
    (False, {"DDP_DOCTOR_PROGRESS": "1"}, False),  # the option wins
    (None, {"DDP_DOCTOR_PROGRESS": "maybe"}, True),  # neither: as unset
])
def test_progress_is_on_unless_asked_off(flag, env, want):
    assert enabled(flag, env) is want


def test_preflight_lines_come_at_doubling_steps_naming_each_stage(tmp_path):
    note_stage(str(tmp_path), 0, "rendezvous", T0 + 2)
    stages = read_stages(str(tmp_path))
    rule = StageLines(T0, bound=240.0, nproc=2)
    assert rule.due(stages, T0 + 4.9) is None
    assert rule.due(stages, T0 + 5.2) == ("ddp-doctor: preflight running for 5.2 s: rank 0 in rendezvous (3.2 s); "
                                          "rank 1 not started yet; the launch is stopped at 240 s")
    assert rule.due(stages, T0 + 9) is None
    assert rule.due(stages, T0 + 25) is not None  # 10 and 20 passed: one line
    assert rule.due(stages, T0 + 39) is None
    assert [t for t in range(40, 400, 10) if rule.due(stages, T0 + t)] == [40, 80, 160]  # none at or past the bound


def test_ranks_in_one_stage_share_it():
    stages = {r: {"rank": r, "stage": "group_checks", "since": T0 + r} for r in range(3)}
    line = StageLines(T0, bound=240.0, nproc=3).due(stages, T0 + 6)
    assert "ranks 0, 1, 2 in group_checks (6.0 s)" in line


def test_a_node_of_several_names_its_own_ranks():
    # a pod's launch of ranks 2 and 3 of a two-pod job: rank 0 is another pod's, never "not started"
    stages = {2: {"rank": 2, "stage": "meet", "since": T0 + 1}}
    line = StageLines(T0, bound=240.0, nproc=2, first_rank=2).due(stages, T0 + 6)
    assert "rank 2 in meet (5.0 s); rank 3 not started yet" in line and "rank 0" not in line


def test_the_options_are_the_parents_own():
    from ddp_doctor.cli.launch import rank_argv
    from ddp_doctor.cli.run_argv import run_options, split_argv
    assert rank_argv(["--progress", "--timeout", "5", "--no-progress"]) == ["--timeout", "5"]
    torchrun, doctor, target = split_argv(["--nproc-per-node", "2", "--progress", "train.py", "--progress"])
    assert doctor == ["--progress"] and target.args == ["--progress"]  # the script's own stays its own
    assert run_options(doctor, target).progress is True
    assert run_options(["--no-progress"], target).progress is False
    for quiet in ("-q", "--quiet"):
        assert split_argv([quiet, "train.py"])[1] == ["--quiet"]
        assert run_options(["--quiet"], target).progress is False
    assert rank_argv(["-q", "--quiet", "--timeout", "5"]) == ["--timeout", "5"]
    assert run_options([], target).progress is None


def test_under_run_only_the_ranks_seen_are_named_with_the_per_wait_bound():
    stages = {1: {"rank": 1, "stage": "store", "since": T0 + 1}}
    line = StageLines(T0, None, None, per_wait=60.0).due(stages, T0 + 5)
    assert line == ("ddp-doctor: preflight running for 5.0 s: rank 1 in store (4.0 s); "
                    "each wait is bounded by 60 s (--timeout)")
    assert "no rank started yet" in StageLines(T0, None, None, per_wait=60.0).due({}, T0 + 5)


def test_a_rank_notes_each_stage_it_enters(tmp_path):
    from types import SimpleNamespace

    from ddp_doctor.preflight_ranks.one_rank import RankPreflight
    rank = SimpleNamespace(launch_dir=str(tmp_path), rank=3, timeline=[])
    with RankPreflight._stage(rank, "rendezvous"):
        assert read_stages(str(tmp_path))[3]["stage"] == "rendezvous"
    with RankPreflight._stage(SimpleNamespace(launch_dir=None, rank=0, timeline=[]), "view"):
        pass  # no launch directory (under an outside launcher): nothing written


def test_ranks_stalling_at_different_moments_add_no_lines_of_their_own():
    rule = HangLines(HangBound(10.0))
    beats = {r: hb(T0 + r * 0.3) for r in range(8)}  # each stalls a little after the one before
    got = lines_over(rule, beats, [t / 10 for t in range(0, 100)])
    assert len(got) == 4, got  # one per fifth of the bound, not one per rank and fifth
    assert got[-1][1].startswith("ddp-doctor: ranks 0, 1, 2, 3 and 4 more have made no progress for 8.0 s")


def test_the_parent_says_the_preflight_stage_then_the_stall_from_the_run_directory(tmp_path, capsys):
    import time

    from ddp_doctor.training import records
    from ddp_doctor.training.run.stall_watch import say_progress
    run_dir = str(tmp_path)
    now = time.time()
    stages = StageLines(now - 6, None, None, per_wait=60.0)
    lines = HangLines(HangBound(5.0))
    records.write_heartbeat(run_dir, 0, {"time": now, "last_progress": now - 4, "phase": "preflight"})
    (tmp_path / "preflight").mkdir()  # made by each rank before its preflight (training/run/watched_rank.py)
    note_stage(str(tmp_path / "preflight"), 0, "rendezvous", now - 4)
    say_progress(lines, run_dir, stages)
    records.write_heartbeat(run_dir, 0, {"time": now, "last_progress": now - 2, "phase": "training",
                                         "where": "/w/train.py:5 in main", "in_collective": False})
    say_progress(lines, run_dir, stages)
    out = capsys.readouterr()
    said = out.err.splitlines()
    assert out.out == "" and len(said) == 2, said
    assert said[0].startswith("ddp-doctor: preflight running for 6") and "rank 0 in rendezvous" in said[0]
    assert said[1].startswith("ddp-doctor: rank 0 has made no progress for 2") and "train.py:5 in main" in said[1]
