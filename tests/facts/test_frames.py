"""facts/frames.py: which recorded frames are the user's code. A frame recorded on another host (a
peer's ledger, an evidence file judged again elsewhere) is judged by its path alone: that host's
libraries, standard library and ddp-doctor's own package are never the user's code, wherever they
were installed."""
from __future__ import annotations

import pytest

from ddp_doctor.facts.frames import is_library_file, is_user_file


@pytest.mark.parametrize("path", [
    "/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py",
    "/usr/lib/python3.12/threading.py",  # another host's standard library
    "/home/ci/src/ddp-doctor/ddp_doctor/training/probes/dist_wrappers.py",  # ddp-doctor checked out elsewhere
    "<string>",
])
def test_another_hosts_library_frames_are_never_the_users(path):
    assert is_library_file(path)


@pytest.mark.parametrize("path", ["/home/me/project/train.py", "/checkout/tests/run_scripts/size_mismatch.py",
                                  "/work/lib/train_utils.py"])
def test_a_users_script_anywhere_is_the_users(path):
    assert not is_library_file(path) and is_user_file(path)
