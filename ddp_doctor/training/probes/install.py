"""Starting the probes in a process: `install(out_dir)` makes this process's recorder and puts the
wrappers in place (dist_wrappers, loader_wrappers, trainer_wrapper, the fork hooks of children, the
start sites of threads and child processes of exit_holders, threading.excepthook, os._exit) once;
`install_in_child` does it from sitecustomize once the child imports torch.

The wrappers only record and then call the original: no collective is added, nothing the script
sees changes.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any, Callable

from ddp_doctor.facts.frames import COLLECTIVES, is_user_file
from ddp_doctor.training.probes import (
    children,
    collective_sites,
    dist_wrappers,
    exit_holders,
    init_calls,
    loader_wrappers,
    recorder,
)
from ddp_doctor.training.probes.import_hooks import when_imported
from ddp_doctor.training.probes.patching import record_quietly, wrap_in_place
from ddp_doctor.training.probes.recorder import Recorder
from ddp_doctor.training.probes.trainer_wrapper import wrap_trainer

_patched = False


def install(out_dir: str | None) -> Recorder:
    """Start recording in this process (idempotent); returns the recorder."""
    with recorder.STATE_LOCK:
        rec, made = recorder.make_current(out_dir)
        if made:
            atexit.register(_at_exit)
        _patch_torch()
    exit_holders.install()  # where non-daemon threads and children start: what may keep the rank alive (DDP806)
    wrap_in_place(threading, "excepthook", _thread_excepthook)  # a thread that dies is noted (DDP815)
    wrap_in_place(os, "_exit", _os_exit)  # a script that ends its process itself is noted (DDP812)
    return rec


def _os_exit(orig: Callable[[int], Any]) -> Callable[[int], Any]:
    """os._exit called by the script's own code (not a library's, not ddp-doctor's): the record
    says so, with the status and the line, before the process ends without its exit handlers."""
    def _exit(status: int) -> Any:
        caller = sys._getframe(1).f_code.co_filename
        rec = recorder.current_recorder()
        if rec is not None and is_user_file(caller):
            record_quietly(rec, "os._exit", lambda: rec.end_by_os_exit(status))
        return orig(status)
    return _exit


def _thread_excepthook(orig: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """threading.excepthook: the exception that ended a thread goes in the record, then Python's
    own hook prints it as before."""
    def excepthook(args: Any) -> Any:
        rec = recorder.current_recorder()
        if rec is not None:
            record_quietly(rec, "thread exception", lambda: rec.note_thread_error(args))
        return orig(args)
    return excepthook


def _at_exit() -> None:
    rec = recorder.current_recorder()
    if rec is not None:
        rec.end(how="exit")


def _out_dir() -> str | None:
    rec = recorder.current_recorder()
    return rec.out_dir if rec is not None else None


def _patch_torch() -> None:
    global _patched
    if _patched:
        return
    _patched = True
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _BaseDataLoaderIter
    from torch.utils.data.distributed import DistributedSampler

    # One wrapper for both names of each function: dist.X and c10d.X are the same object.
    init = init_calls.init_arguments_wrapper(_out_dir)(
        dist_wrappers.init_process_group_wrapper(c10d.init_process_group))
    for owner in (dist, c10d):
        wrap_in_place(owner, "init_process_group", lambda orig: init)
    wrap_in_place(type(os.environ), "__setitem__", init_calls.env_write_wrapper)  # where MASTER_PORT was set
    spawn_module = sys.modules.get("torch.multiprocessing.spawn")  # mp.spawn calls its start_processes
    if spawn_module is not None and hasattr(spawn_module, "start_processes"):
        original = spawn_module.start_processes
        start = init_calls.spawn_wrapper(original)
        for owner in (spawn_module, torch.multiprocessing):
            if getattr(owner, "start_processes", None) is original:
                wrap_in_place(owner, "start_processes", lambda orig, start=start: start)
    destroy = dist_wrappers.destroy_process_group_wrapper(c10d.destroy_process_group)
    for owner in (dist, c10d):
        wrap_in_place(owner, "destroy_process_group", lambda orig: destroy)
    wrap_collectives()  # the script's call sites, for the ledger
    wrap_in_place(torch.cuda, "set_device", dist_wrappers.set_device_wrapper)
    wrap_in_place(DistributedDataParallel, "__init__", dist_wrappers.ddp_init_wrapper)
    wrap_in_place(DistributedSampler, "set_epoch", loader_wrappers.set_epoch_wrapper)
    wrap_in_place(DataLoader, "__init__", loader_wrappers.loader_init_wrapper)
    wrap_in_place(DataLoader, "__iter__", loader_wrappers.loader_iter_wrapper)
    wrap_in_place(_BaseDataLoaderIter, "_next_index", loader_wrappers.next_index_wrapper)
    wrap_in_place(_BaseDataLoaderIter, "__next__", loader_wrappers.next_batch_wrapper)
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        register_optimizer_step_post_hook(dist_wrappers.on_optimizer_step)
    except Exception:  # noqa: BLE001 - a torch without the hook: the job runs without the step probe
        pass
    os.register_at_fork(before=children.before_fork, after_in_child=children.after_fork_in_child)
    when_imported("transformers.trainer", wrap_trainer)


def install_in_child() -> None:
    """From sitecustomize: record this interpreter once it imports torch (not before: importing
    torch at start-up would slow down every Python the script starts)."""
    out_dir = os.environ.get(children.PROBE_DIR_ENV)
    if not out_dir:
        return

    def started(_m: object) -> None:
        install(out_dir).started_by = children.started_by()
        from ddp_doctor.training.probes import child_beat
        child_beat.start(out_dir)  # a rank the script started: its parent sees its progress here
    when_imported("torch", started)


def wrap_collectives() -> None:
    """The call-site wrappers (collective_sites.py) on torch.distributed's collectives, and, without
    a flight recorder, the Python calls' details (they are then the ledger). Nothing else is patched:
    the pytest plugin's ranks use this alone."""
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    if not hasattr(torch._C._distributed_c10d, "_dump_fr_trace_json"):
        collective_sites.enable_detail()
    for name in COLLECTIVES:
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        site = collective_sites.collective_wrapper(name)(fn)
        for owner in (dist, c10d):
            if getattr(owner, name, None) is fn:
                wrap_in_place(owner, name, lambda orig, site=site: site)
