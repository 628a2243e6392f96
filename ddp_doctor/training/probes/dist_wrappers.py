"""Wrappers around torch.distributed and DDP: init_process_group, destroy_process_group,
torch.cuda.set_device, DistributedDataParallel.__init__, and the optimizer step hook. Each records
an event (with the user's call site) and then calls the original unchanged.

Each DDP model also gets a forward pre-hook (`on_ddp_forward`) that counts its forwards with
autograd on, and optimizer steps over a DDP model's parameters are counted apart: together they
tell which DataLoaders fed the distributed model's training (the sampler rules judge only those).
Each DDP model's reduced parameters are named once, as it is built (`reduced_parameter_names`): DDP's
errors name them by index only."""
from __future__ import annotations

import weakref
from typing import Any, Callable

from ddp_doctor.training.probes.call_sites import called_from_library
from ddp_doctor.training.probes.patching import record_quietly
from ddp_doctor.training.probes.record_exchange import share_across_nodes
from ddp_doctor.training.probes.recorder import (
    MAX_PARAMETER_NAMES,
    Recorder,
    current_recorder,
    group_is_up,
    torch_dist,
)

# Each live DDP model -> ids of its parameters (weak keys: a freed model's ids may be reused).
_DDP_PARAMS: "weakref.WeakKeyDictionary[Any, frozenset[int]]" = weakref.WeakKeyDictionary()
# Optimizer -> (DDP models made so far, its param groups, whether it updates a DDP model): the
# answer is worked out once per optimizer, not at every step.
_UPDATES_DDP: "weakref.WeakKeyDictionary[Any, tuple[int, int, bool]]" = weakref.WeakKeyDictionary()
_ddp_made = 0


def on_optimizer_step(optimizer: Any, *args: Any) -> None:
    """Registered as torch's optimizer step post-hook: counts steps, check-sums after the first,
    and counts apart the steps that update a DDP model."""
    rec = current_recorder()
    if rec is not None:
        rec.on_step(optimizer, *args)
        if _ddp_made and _updates_ddp_model(optimizer):
            rec.ddp_steps += 1


def _updates_ddp_model(optimizer: Any) -> bool:
    """Whether the optimizer holds a parameter of a live DDP model (the first of each group is
    enough: a group's parameters belong to one model in practice)."""
    try:
        groups = optimizer.param_groups
        known = _UPDATES_DDP.get(optimizer)
        if known is not None and known[0] == _ddp_made and known[1] == len(groups):
            return known[2]
        firsts = [id(g["params"][0]) for g in groups if g.get("params")]
        answer = any(i in ids for ids in list(_DDP_PARAMS.values()) for i in firsts)
        _UPDATES_DDP[optimizer] = (_ddp_made, len(groups), answer)
        return answer
    except Exception:  # noqa: BLE001 - a user's optimizer may hold anything: a probe never breaks the step
        return False


def on_ddp_forward(module: Any, args: Any) -> None:
    """Forward pre-hook of every DDP model: counts forwards with autograd on (training: DDP then
    all-reduces the gradients in backward; evaluation under no_grad is not counted). A function of
    this module, not a closure, so that a model carrying the hook still pickles."""
    rec = current_recorder()
    if rec is not None:
        import torch
        if torch.is_grad_enabled():
            rec.ddp_forwards += 1


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
        record_quietly(rec, "DistributedDataParallel hook", lambda: _watch_training(self))
        record_quietly(rec, "DistributedDataParallel parameters", lambda: _note_reduced_parameters(rec, self))
    return __init__


def reduced_parameter_names(ddp: Any) -> tuple[list[str], int] | None:
    """The names of the parameters a DDP model's reducer holds, in the reducer's order, and how
    many (at most MAX_PARAMETER_NAMES names are listed); None without a reducer (every parameter's
    all-reduce delayed). The indices in DDP's errors ("Parameter indices which did not receive
    grad", "Parameter at index N ... marked as ready twice") count in this list. It is built as
    torch's `_build_params_for_reducer` builds it: the parameters of module.named_modules(), each
    module's own (recurse=False), that require grad and whose "<module>.<name>" is not in
    parameters_to_ignore, a parameter shared by several modules counted once, where first met.
    Each is named as module.named_parameters() names it (the first name of a shared one)."""
    if getattr(ddp, "reducer", None) is None:
        return None
    module = ddp.module
    ignored = set(getattr(ddp, "parameters_to_ignore", None) or ())
    name_of: dict[int, str] = {}
    for name, p in module.named_parameters():
        name_of.setdefault(id(p), name)
    seen: set[int] = set()
    names: list[str] = []
    for module_name, m in module.named_modules():
        for own, p in m.named_parameters(recurse=False):
            if not p.requires_grad or f"{module_name}.{own}" in ignored or id(p) in seen:
                continue
            seen.add(id(p))
            if len(names) < MAX_PARAMETER_NAMES:
                names.append(name_of.get(id(p)) or f"{module_name}.{own}".lstrip("."))
    return names, len(seen)


def _note_reduced_parameters(rec: Recorder, ddp: Any) -> None:
    got = reduced_parameter_names(ddp)
    if got is not None:
        rec.note_ddp_parameters(type(ddp.module).__name__, *got)


def _watch_training(ddp: Any) -> None:
    global _ddp_made
    _DDP_PARAMS[ddp] = frozenset(id(p) for p in ddp.parameters())
    _ddp_made += 1
    ddp.register_forward_pre_hook(on_ddp_forward)


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
