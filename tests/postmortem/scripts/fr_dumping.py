"""Runs a training script as `python SCRIPT` would, and writes this rank's flight recorder with
torch's own dump call (torch._C._distributed_c10d._dump_fr_trace, the pickle torch writes on an
NCCL timeout) when the script raises, ends, or gets SIGTERM: what a team's own handler does to
keep the evidence of a job that runs without ddp-doctor. PG_TIMEOUT=S: the process group's
timeout, as the script's own init_process_group(timeout=...) would set it. The dump goes to $FR_DUMP_DIR/
nccl_trace_rank_<RANK>, torch's default name. Needs TORCH_FR_BUFFER_SIZE set (the recorder is off
without it). EXIT_TOGETHER_DIR=D: a rank that raises prints its traceback, then waits (bounded) until
every local rank has printed its own before it exits: torchrun stops the others at the first exit,
and two ranks whose init times out a start-up apart would otherwise leave one traceback or two by
chance; the test reads what each rank waited for."""
import atexit
import os
import runpy
import signal
import sys

import torch.distributed as dist


def dump(*_):
    import torch
    path = os.path.join(os.environ["FR_DUMP_DIR"], f"nccl_trace_rank_{os.environ['RANK']}")
    data = torch._C._distributed_c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=True,
                                                     onlyActive=False)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def on_term(signo, _frame):
    dump()
    signal.signal(signo, signal.SIG_DFL)
    os.kill(os.getpid(), signo)


if os.environ.get("PG_TIMEOUT"):  # the script's own init_process_group(timeout=...), as a team sets it
    import datetime
    _init = dist.init_process_group

    def init_process_group(*args, **kwargs):
        kwargs.setdefault("timeout", datetime.timedelta(seconds=float(os.environ["PG_TIMEOUT"])))
        return _init(*args, **kwargs)

    dist.init_process_group = init_process_group
signal.signal(signal.SIGTERM, on_term)
atexit.register(dump)
script = sys.argv[1]
sys.argv = sys.argv[1:]
try:
    runpy.run_path(script, run_name="__main__")
except BaseException:
    dump()
    together = os.environ.get("EXIT_TOGETHER_DIR")
    if not together:
        raise
    sys.excepthook(*sys.exc_info())
    sys.stderr.flush()
    open(os.path.join(together, f"printed.{os.environ['LOCAL_RANK']}"), "w").close()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from helpers.procs import wait_for
    try:  # the peer's own init timeout comes within PG_TIMEOUT
        wait_for(lambda: len(os.listdir(together)) >= int(os.environ["LOCAL_WORLD_SIZE"]), 30, "the peers' tracebacks")
    except AssertionError:  # a peer that never printed: this rank's own is out, it exits
        pass
    os._exit(1)
del dist
