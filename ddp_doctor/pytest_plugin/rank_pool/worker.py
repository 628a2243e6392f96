"""One rank of a distributed test, in a process forked by the forkserver: its process setup
(process group, output files, stack dumps on SIGUSR1, the test's environment), loading the test
function from the code the parent compiled, running it with an initialised process group, and
the result file it leaves for the parent.
"""
from __future__ import annotations

import marshal
import os
import pickle
import signal
import sys
import time
import traceback
from typing import Any

from ddp_doctor.processes.tree import die_with_parent
from ddp_doctor.pytest_plugin.rank_pool.wire import output_path, result_path, store_path
from ddp_doctor.time_limit import call_with_time_limit

DESTROY_BOUND_S = 10.0      # bound on destroy_process_group in a rank that passed
PG_TIMEOUT_MARGIN_S = 10.0  # the process group's own timeout is the test's plus this
FINISHED_KEY = "ddp_doctor/finished"
INITIALISED_KEY = "ddp_doctor/initialised"


def rank_main(spec: dict[str, Any], rank: int, pgid: int, server: int) -> None:
    """The forked child's whole life: never returns (os._exit)."""
    die_with_parent(signal.SIGKILL)
    if os.getppid() != server:
        os._exit(71)
    try:
        os.setpgid(0, pgid)
    except OSError:
        os.setpgid(0, 0)
    d = spec["dir"]
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        f = os.open(output_path(d, name, rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    import faulthandler
    stacks = open(output_path(d, "stack", rank), "w")  # noqa: SIM115 - lives until _exit
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    ws = int(spec["world_size"])
    os.environ.clear()
    os.environ.update(spec["env"])
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ws),
                      LOCAL_WORLD_SIZE=str(ws), GROUP_RANK="0")
    try:
        os.chdir(spec["cwd"])
    except OSError:
        pass
    sys.path[:] = list(spec["sys_path"])
    from ddp_doctor.training.run.child_watch import watch_children
    children = watch_children(by_group=False)  # the test's ranks share one process group
    result = run_test(spec, rank)
    # what the test started and left running is ended here: os._exit below ends only this process
    result["leftovers"] = children.end(interpreter_exits=False)
    path = result_path(d, rank)
    with open(path + ".tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(path + ".tmp", path)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed or broken stream: the result is already written
        pass
    os._exit(0)  # no interpreter teardown: gloo may abort in static destructors (docs/facts.md)


def _load_function(spec: dict[str, Any]) -> Any:
    import types
    name = spec["module"]
    mod = types.ModuleType(name)
    mod.__file__ = spec["path"]
    mod.__package__ = name.rpartition(".")[0]
    sys.modules[name] = mod
    exec(marshal.loads(spec["code"]), mod.__dict__)  # noqa: S102 - the test module, as pytest compiled it
    obj: Any = mod
    for part in spec["qualname"].split("."):
        obj = getattr(obj, part)
    if spec.get("cls"):
        cls: Any = mod
        for part in spec["cls"].split("."):
            cls = getattr(cls, part)
        obj = getattr(cls(), spec["qualname"].rsplit(".", 1)[-1])
    return obj


def _user_traceback(e: BaseException) -> str:
    """The traceback from the first frame outside this module: the user's code only."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def run_test(spec: dict[str, Any], rank: int) -> dict[str, Any]:
    """Run the test function on this rank with an initialised process group."""
    started = time.time()
    out: dict[str, Any] = {"rank": rank, "outcome": "passed", "message": "", "traceback": "",
                           "time": None, "started": started, "destroy_hung": False}
    skipped_types: tuple[type, ...] = ()
    try:
        from _pytest.outcomes import Skipped
        skipped_types = (Skipped,)
    except ImportError:  # a pytest without this private name: no skip told apart
        pass
    from ddp_doctor.pytest_plugin.rank_pool.ledgers import RankLedger
    book = RankLedger(spec["dir"], rank, int(spec["world_size"]))
    book.prepare()  # before the test module is loaded: its `from torch.distributed import ...` too
    try:
        func = _load_function(spec)
        kwargs = pickle.loads(spec["kwargs"])
        out["loaded"] = time.time()
        for name in spec.get("rank_arg", ()):
            kwargs[name] = rank
        for name in spec.get("world_size_arg", ()):
            kwargs[name] = int(spec["world_size"])
        from datetime import timedelta

        import torch.distributed as dist
        if spec["backend"] == "nccl":
            import torch
            torch.cuda.set_device(rank)
        store = dist.FileStore(store_path(spec["dir"]), int(spec["world_size"]))
        dist.init_process_group(spec["backend"], store=store, rank=rank,
                                world_size=int(spec["world_size"]),
                                # past the parent's hard timeout, so a hang ends one way:
                                # every live rank's stack, then the kill
                                timeout=timedelta(seconds=float(spec["timeout"]) + PG_TIMEOUT_MARGIN_S))
        # gloo's connectFullMesh is not a barrier: a rank that left right after its own init (a
        # skip, a quick failure) would break a peer still connecting. Wait for every rank's init.
        store.add(INITIALISED_KEY, 1)
        end = time.monotonic() + float(spec["timeout"])
        while store.add(INITIALISED_KEY, 0) < int(spec["world_size"]) and time.monotonic() < end:
            time.sleep(0.001)
        out["initialised"] = time.time()
        book.test_started()
        try:
            func(**kwargs)
        except BaseException as e:  # Skipped and Failed too: the ledger keeps it, then it goes on up
            _leave_ledger(book, e, skipped_types)
            raise
        finally:
            try:
                finished = store.add(FINISHED_KEY, 1)  # peers that passed wait for every rank to be done
            except Exception:  # noqa: BLE001 - never hide the test's own exception
                finished = 0
        out["time"] = time.time()
        book.left(f"returned from {spec['qualname']}", finished < int(spec["world_size"]))
        # A rank that finished early must not leave while a peer still talks to it (gloo's
        # connectFullMesh is not a barrier): wait until every rank has left the test function.
        # Bounded past the parent's timeout: a peer that hangs is ended by the parent (stacks,
        # ledgers, then the kill), never by this rank leaving its process group under it.
        end = time.monotonic() + float(spec["timeout"]) + PG_TIMEOUT_MARGIN_S
        while store.add(FINISHED_KEY, 0) < int(spec["world_size"]) and time.monotonic() < end:
            time.sleep(0.002)
        out["all_finished"] = time.time()
        destroyed = call_with_time_limit(dist.destroy_process_group, DESTROY_BOUND_S,
                                         name="ddp-doctor-destroy-process-group")
        if not destroyed.finished:
            out["destroy_hung"] = True
        elif destroyed.error is not None:
            # an error in teardown does not fail a test that passed; it shows in the rank's stderr
            sys.stderr.write(destroyed.traceback)
        out["destroyed"] = time.time()
    except BaseException as e:  # noqa: BLE001 - Skipped and Failed derive from BaseException
        if book.position is None:  # raised outside the test function (loading it, init)
            _leave_ledger(book, e, skipped_types)
        out["time"] = out["time"] or time.time()
        if skipped_types and isinstance(e, skipped_types):
            out["outcome"] = "skipped"
            out["message"] = str(getattr(e, "msg", e))
        else:
            out["outcome"] = "failed"
            msg = str(e)
            out["message"] = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
            pytrace = getattr(e, "pytrace", True)
            out["traceback"] = _user_traceback(e) if pytrace else out["message"] + "\n"
            out["exception"] = _exception_record(e, out["traceback"], out["time"])
    return out


def _exception_record(e: BaseException, text: str, when: float) -> dict[str, Any]:
    """The exception as `ddp-doctor run` records a script's (training/run/target.py)."""
    return {"type": type(e).__name__, "message": str(e), "traceback": text, "time": when}


def _leave_ledger(book: Any, e: BaseException, skipped_types: tuple[type, ...]) -> None:
    """The ledger at the test's end by an exception: a skip leaves the test, anything else failed."""
    try:
        if skipped_types and isinstance(e, skipped_types):
            book.left(f"pytest.skip: {getattr(e, 'msg', e)}", True)
        else:
            book.failed(_exception_record(e, _user_traceback(e), time.time()))
    except Exception:  # noqa: BLE001 - the test's own exception is what matters
        pass
