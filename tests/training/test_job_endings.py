"""Every rank's ending in the job's store (training/run/endings.py), against a real TCPStore: the
verdict of a job on several nodes needs every rank's ending, and a rank seen gone on its node is
named on the others (issue 19, item 1)."""
from __future__ import annotations

import os

import pytest

from ddp_doctor.training import records
from ddp_doctor.training.run import endings

torch_dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def store_env():
    from helpers.procs import free_port
    port = free_port()
    store = torch_dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
           "TORCHELASTIC_RUN_ID": f"t{os.getpid()}-{port}"}
    yield env
    del store


def _node(tmp_path, name, ranks, exit_codes):
    """A node's run directory with its ranks' outcome records."""
    d = tmp_path / name
    d.mkdir()
    for r in ranks:
        records.write_outcome(str(d), r, {"exit_code": exit_codes.get(r, 0), "exception": None})
    return str(d)


def test_the_last_rank_of_the_job_copies_every_ending_and_a_gone_rank_is_named_on_the_other_node(tmp_path, store_env):
    node1 = _node(tmp_path, "node1", [2], {2: 1})
    records.write_heartbeat(node1, 3, {"time": 1.0, "phase": "training", "where": "train.py:9 in step"})
    node0 = _node(tmp_path, "node0", [0, 1], {})
    # node 1: rank 2 failed and saw rank 3's process gone without an ending (SIGKILL)
    seen = endings.exchange(node1, 2, failed=True, gone={3: {"pid": 999999, "where": "train.py:9 in step"}},
                            env=store_env)
    assert seen.ended == {2: "failed", 3: "gone"} and not seen.complete
    # node 0: rank 1 ended well, not last: nothing copied, the job has not ended
    first = endings.exchange(node0, 1, failed=False, env=store_env)
    assert not first.complete and first.copied == [] and first.running() == [0]
    last = endings.exchange(node0, 0, failed=False, env=store_env)
    assert last.complete and sorted(last.copied) == [2, 3]
    out = records.read_outcomes(node0)
    assert out[2]["exit_code"] == 1 and out[2]["remote"] is True
    gone = endings.remote_gone(node0)
    assert list(gone) == [3] and gone[3]["seen_by"] == 2 and gone[3]["where"] == "train.py:9 in step"


def test_rank_0_waits_a_bounded_moment_and_says_which_ranks_still_run(tmp_path, store_env):
    node0 = _node(tmp_path, "node0", [0, 1], {})
    endings.exchange(node0, 1, failed=False, env=store_env)
    job = endings.exchange(node0, 0, failed=False, env=store_env)
    assert not job.complete
    job = endings.wait_for_job(node0, job, 0.6, env=store_env)
    assert not job.complete and job.running() == [2, 3] and job.copied == []
    assert set(records.read_outcomes(node0)) == {0, 1}  # nothing of the other node's was made up


def test_without_a_store_nothing_is_known_and_nothing_raises(tmp_path):
    env = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}  # no MASTER_ADDR/PORT
    job = endings.exchange(str(tmp_path), 0, failed=False, env=env)
    assert job.world == 0 and not job.complete
    assert endings.wait_for_job(str(tmp_path), job, 5.0, env=env) is job


def test_the_wait_is_bounded_and_read_from_the_environment():
    assert endings.job_end_wait({}) == endings.JOB_END_WAIT
    assert endings.job_end_wait({endings.JOB_END_WAIT_ENV: "2.5"}) == 2.5
    assert endings.job_end_wait({endings.JOB_END_WAIT_ENV: "1e308"}) == 3600.0
    assert endings.job_end_wait({endings.JOB_END_WAIT_ENV: "soon"}) == endings.JOB_END_WAIT
