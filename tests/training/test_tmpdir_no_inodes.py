"""TMPDIR on a file system with no free inodes: Python's tempfile passes over it without a word, so
the run directory lands elsewhere; ddp-doctor says so (DDP813, naming TMPDIR and "no free inodes")
and a correct job passes (exit 0), never a usage error (exit 2). The unit test fakes the file
system; the end-to-end one mounts a tiny tmpfs where it may (root)."""
from __future__ import annotations

import os
import subprocess
from collections import namedtuple
from pathlib import Path

import pytest
from helpers.procs import DDP, clean_env, ids, load_json, run

from ddp_doctor.report import private_files

OK = str(Path(__file__).resolve().parents[1] / "run_scripts" / "ok_allreduce.py")
Stat = namedtuple("Stat", "f_bavail f_frsize f_files f_favail")


def test_a_tmpdir_without_free_inodes_is_named_when_the_records_go_elsewhere(tmp_path, monkeypatch):
    full, other = tmp_path / "full", tmp_path / "other"
    full.mkdir()
    other.mkdir()
    real = os.statvfs
    monkeypatch.setattr(private_files.os, "statvfs",
                        lambda p: Stat(1 << 20, 4096, 1000, 0) if os.path.realpath(p) == str(full) else real(p))
    monkeypatch.setenv("TMPDIR", str(full))
    monkeypatch.setattr(private_files.tempfile, "gettempdir", lambda: str(other))  # what tempfile does: skip it
    d, note = private_files.make_records_dir()
    try:
        assert os.path.dirname(d) == str(other), d
        assert note is not None and f"TMPDIR {full}: its file system has no free inodes" in note, note
        assert f"kept in {d} instead" in note, note
    finally:
        os.rmdir(d)
    monkeypatch.setenv("TMPDIR", str(other))  # the temp dir Python chose is the one asked for: no word
    d, note = private_files.make_records_dir()
    os.rmdir(d)
    assert note is None, note


@pytest.fixture
def no_inodes(tmp_path):
    d = tmp_path / "noinodes"
    d.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,nr_inodes=16", "tmpfs", str(d)],
                                           capture_output=True, timeout=30).returncode != 0:
        pytest.skip("a tmpfs cannot be mounted here (root only)")
    try:
        n = 0
        while True:  # use up every inode
            try:
                (d / f"f{n}").touch()
            except OSError:
                break
            n += 1
        assert os.statvfs(d).f_favail == 0
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=30)


@pytest.mark.slow
def test_a_correct_job_with_tmpdir_out_of_inodes_passes_with_a_warning(tmp_path, no_inodes):
    res = run([*DDP, "run", "--nproc-per-node", "2", "--skip", "communication", "--report", "r.json", OK],
              clean_env(TMPDIR=str(no_inodes)), str(tmp_path), 240)
    assert res.rc == 0, res.output
    rep = load_json(str(tmp_path / "r.json"))
    assert rep["status"] == "warn" and ids(rep, "warning") == {"DDP813"}, rep["findings"]
    (found,) = [f for f in rep["findings"] if f["id"] == "DDP813"]
    assert f"TMPDIR {no_inodes}: its file system has no free inodes" in found["message"], found
    assert "no free inodes" in res.stderr, res.output
