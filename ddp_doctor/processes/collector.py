"""Python's cyclic garbage collector around what ddp-doctor's own processes do before the script:
importing torch and running the preflight.

A full collection scans every object the process holds; once torch is imported that is about a
tenth of a second, and torch's import alone sets off two or three of them. Objects made by imports
live as long as the process, so ddp-doctor's processes (the launcher, each rank before its script)
import with the collector paused and then freeze what exists (gc.freeze: later collections skip
it). The preflight's own garbage is collected before the script starts, and a rank's script runs
with the collector as a bare `python` gives it (everything unfrozen).
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def imports_uncollected() -> Iterator[None]:
    """No collection while the block imports (torch's import makes little garbage and many objects
    that live on); what exists at its end is frozen: later collections skip it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


@contextmanager
def garbage_of_block_collected() -> Iterator[None]:
    """Collect, as the block ends, the garbage made in it: a preflight's store and process group sit
    in reference cycles, and must be gone before the script's own init_process_group (its store may
    take the same port). What existed before the block is frozen meanwhile, so the collection scans
    the block's objects only (a millisecond where a full one takes a tenth of a second); at its
    end every object is unfrozen, as a bare `python` would hold them."""
    gc.freeze()
    try:
        yield
    finally:
        gc.collect()
        gc.unfreeze()
