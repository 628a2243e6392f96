"""Where each rank was when a stop came during `ddp-doctor run`'s preflight: its stage (the
stage-N.json files the preflight's ranks write), in DDP808's message."""
from __future__ import annotations

from ddp_doctor.checks.stalls import interrupted_finding
from ddp_doctor.processes.launch_dir import note_stage
from ddp_doctor.processes.stop_signals import Interrupt
from ddp_doctor.training.run.parent_report import preflight_positions


def test_a_stop_during_the_preflight_names_each_ranks_stage(tmp_path):
    note_stage(str(tmp_path), 0, "rendezvous", 100.0)
    note_stage(str(tmp_path), 1, "local_checks", 105.0)
    beats = {0: {"pid": 1, "phase": "preflight", "where": None, "steps": 0}}
    at = preflight_positions(str(tmp_path), beats, now=112.0)
    assert sorted(at) == [0, 1]
    f = interrupted_finding(Interrupt(15), at, {})
    assert f.ranks == [0, 1]
    assert "rank 0: in the preflight, stage rendezvous, for 12 s" in f.message
    assert "rank 1: in the preflight, stage local_checks, for 7 s" in f.message
    assert "steps" not in f.message


def test_a_rank_in_training_keeps_its_heartbeat(tmp_path):
    note_stage(str(tmp_path), 0, "group_checks", 100.0)
    beats = {0: {"pid": 1, "phase": "training", "where": "train.py:9 in <module>", "steps": 3}}
    assert preflight_positions(str(tmp_path), beats, now=112.0) == beats


def test_no_stage_files_leave_the_heartbeats(tmp_path):
    beats = {0: {"pid": 1, "phase": "preflight"}}
    assert preflight_positions(str(tmp_path / "missing"), beats) == beats
