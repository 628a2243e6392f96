"""The check catalogue: every ID ddp-doctor can report is declared in a module of this package.

Checks (`@check`) and the events the machinery raises (`declare`) live side by side, one module per
concern; importing a module registers its entries in ddp_doctor.registry. :func:`load_catalogue`
imports every one of them by name (the list below is the whole catalogue), then the modules a team
names in DDP_DOCTOR_CHECK_MODULES. The queries over the loaded catalogue live here too, so that the
registry itself never imports a check.
"""
from __future__ import annotations

import importlib
import os
from typing import Iterable

from ddp_doctor import registry
from ddp_doctor.findings import CATEGORIES
from ddp_doctor.registry import Check, selected


def load_catalogue() -> dict[str, Check]:
    """Import every catalogue module (registration happens at import) and return the registry."""
    from ddp_doctor.checks import (  # noqa: F401 - imported for their registrations
        arrivals,
        barrier_waits,
        causes,
        ci_runner,
        collectives,
        communication,
        consistency,
        crash_ledgers,
        ddp_parameters,
        efa,
        gpu,
        history_rules,
        host,
        host_busy,
        init_arguments,
        init_late,
        init_order,
        init_waits,
        internal,
        job,
        kubernetes,
        launcher_env,
        leftover_rules,
        nccl_versions,
        network,
        post_mortem,
        probe_records,
        rank_endings,
        rendezvous,
        replica_consistency,
        sagemaker_account,
        sagemaker_config,
        sagemaker_job,
        sagemaker_launch,
        sampler,
        signatures,
        slurm,
        stalls,
        stops,
        teardown,
        thread_errors,
        training_probes,
        training_scale,
        wrapped_errors,
    )
    # Teams add checks of their own by naming their modules (comma-separated); they register with
    # the same decorator and ID rules. A broken one is reported by the runner (DDP001), not fatal.
    for name in (m.strip() for m in os.environ.get(registry.EXTRA_MODULES_ENV, "").split(",")):
        if not name:
            continue
        try:
            importlib.import_module(name)
        except KeyboardInterrupt:  # Ctrl-C while it loads: the user's, not the plugin's
            raise
        except BaseException as e:  # noqa: BLE001 - a broken plugin (sys.exit() included) is reported, not fatal
            registry.LOAD_ERRORS[name] = f"{type(e).__name__}: {e}"
    return registry.REGISTRY


def get(id: str) -> Check:
    return load_catalogue()[id]


def unknown_selectors(selectors: Iterable[str]) -> list[str]:
    """Selectors that match no ID, ID prefix or category (a usage error)."""
    ids = [s for s in selectors if s not in CATEGORIES]
    if not ids:  # the catalogue's import is a tenth of a second a process: only when an ID needs it
        return []
    catalogue = load_catalogue()
    return [s for s in ids if not any(cid.startswith(s.upper()) for cid in catalogue)]


def checks_for(stage: str, select: list[str] | None = None, skip: list[str] | None = None) -> list[Check]:
    """The entries of one stage, by ID, as --select/--skip choose them."""
    return [c for c in sorted(load_catalogue().values(), key=lambda c: c.id)
            if c.stage == stage and selected(c, select or [], skip or [])]
