"""Wrappers around torch.distributed and DDP: init_process_group, destroy_process_group,
torch.cuda.set_device, DistributedDataParallel.__init__, and the optimizer step hook. Each records
an event (with the user's call site) and then calls the original unchanged."""
from __future__ import annotations

import weakref
from typing import Any, Callable

from ddp_doctor.training.probes.call_sites import called_from_library
from ddp_doctor.training.probes.patching import record_quietly
from ddp_doctor.training.probes.record_exchange import share_across_nodes
from ddp_doctor.training.probes.recorder import Recorder, current_recorder, group_is_up, torch_dist


def on_optimizer_step(optimizer: Any, *args: Any) -> None:
    """Registered as torch's optimizer step post-hook: counts steps, check-sums after the first."""
    rec = current_recorder()
    if rec is not None:
        rec.on_step(optimizer, *args)


def init_process_group_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        rec = current_recorder()
        if rec is None:
            return orig(*args, **kwargs)
        def before() -> dict[str, Any]:
            backend = kwargs.get("backend", args[0] if args else None)
            timeout = kwargs.get("timeout")
            already = group_is_up()
            e = rec.event("init_process_group", backend=str(backend) if backend is not None else None,
                          timeout_s=timeout.total_seconds() if hasattr(timeout, "total_seconds") else None,
                          already_initialized=already, by_library=called_from_library(),
                          previous_site=rec.pg.get("site") if already else None)
            if already:
                rec.flush()  # torch is about to refuse: keep the record
            return e

        def after(e: dict[str, Any] | None) -> None:
            dist = torch_dist()
            rec.pg = {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                      "backend": str(dist.get_backend()), "site": (e or {}).get("site")}
            if e is not None:
                e["ok"] = True

        e = record_quietly(rec, "init_process_group", before)
        result = orig(*args, **kwargs)
        record_quietly(rec, "init_process_group", lambda: after(e))
        return result
    return init_process_group


def destroy_process_group_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    def destroy_process_group(group: Any = None) -> Any:
        rec = current_recorder()
        if rec is not None and group is None and group_is_up():
            def before() -> None:
                rec.event("destroy_process_group")
                if rec.steps:
                    rec.checksum("end")
                rec.flush()
                share_across_nodes(rec)
            record_quietly(rec, "destroy_process_group", before)
        return orig(group) if group is not None else orig()
    return destroy_process_group


def set_device_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    def set_device(device: Any) -> Any:
        rec = current_recorder()
        if rec is not None:
            rec.set_device_called = True
            record_quietly(rec, "set_device", lambda: rec.event("set_device", device=str(device)))
        return orig(device)
    return set_device


def _module_device(module: Any) -> str | None:
    for p in getattr(module, "parameters", lambda: [])():
        return str(p.device)
    return None


def ddp_init_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        rec = current_recorder()
        if rec is None:
            return orig(self, module, *args, **kwargs)
        record_quietly(rec, "DistributedDataParallel", lambda: _record_ddp(rec, module, args, kwargs))
        orig(self, module, *args, **kwargs)
        rec.ddp_modules.append(weakref.ref(self))
    return __init__


def _record_ddp(rec: Recorder, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    import torch
    pg_up = group_is_up()
    device_ids = kwargs.get("device_ids", args[0] if args else None)
    current = torch.cuda.current_device() if torch.cuda.is_initialized() else None
    backend = str(torch_dist().get_backend()) if pg_up else None
    count = torch.cuda.device_count() if backend == "nccl" else 0
    rec.event("ddp", pg_initialized=pg_up, device_ids=[str(d) for d in device_ids] if device_ids else None,
              module_device=_module_device(module), current_device=current, device_count=count,
              set_device_called=rec.set_device_called, backend=backend, module_class=type(module).__name__)
    if not pg_up:
        rec.flush()  # the constructor is about to fail: keep the record
