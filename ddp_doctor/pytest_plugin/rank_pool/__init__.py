"""The rank pool behind ``@pytest.mark.distributed``: one forkserver with torch preloaded forks
fresh ranks for every test.

    pytest process ──requests──> forkserver (torch and pytest imported, single-threaded,
        (parent)   <──events────   its own session, dies with the parent: PR_SET_PDEATHSIG)
                                        │ fork, one per rank
                                        v
                   rank r: a process group of the test's ranks, dies with the forkserver,
                           stdout/stderr to files, FileStore in the test's directory, runs the
                           test function, writes its result file, then leaves with os._exit

The parent never imports torch. It bounds every wait: on a timeout it asks the live ranks for
their Python stacks (faulthandler on SIGUSR1), then kills the test's process group. How a rank
ended is decided from two facts: its result file (written before it exits) and its exit status
(reported by the forkserver, which reaps it).

Modules:
    wire        the pipe's framing and messages, the run directory's layout (both sides)
    forkserver  the forkserver's loop (rank side)
    rank        one rank: setup, loading and running the test function, its result file (rank side)
    pool        RankPool and compile_module (parent side)
    results     RankEnd / RunResult: how each rank ended (parent side)
    verdict     Verdict / classify: the test's outcome from its ranks' ends (parent side)

The parent-side names are re-exported here.
"""
from __future__ import annotations

from ddp_doctor.pytest_plugin.rank_pool.pool import RankPool, compile_module
from ddp_doctor.pytest_plugin.rank_pool.results import RankEnd, RunResult
from ddp_doctor.pytest_plugin.rank_pool.verdict import Verdict, classify
from ddp_doctor.pytest_plugin.rank_pool.wire import PRELOAD

__all__ = ["PRELOAD", "RankEnd", "RankPool", "RunResult", "Verdict", "classify", "compile_module"]
