"""Known error signatures: an exception's text -> a finding that says what it means and what to do.

Each signature is a catalogue entry (category training_failure, IDs DDP820 on) plus regular
expressions matched against "Type: message" and the traceback text of the failing rank.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ddp_doctor.registry import Check, declare


@dataclass(frozen=True)
class Signature:
    entry: Check
    patterns: tuple[re.Pattern[str], ...]
    consequence: bool = False  # the error is a symptom of another rank's failure

    def matches(self, text: str) -> bool:
        return any(p.search(text) for p in self.patterns)


SIGNATURES: list[Signature] = []


def signature(id: str, title: str, patterns: list[str], doc: str, *, consequence: bool = False,
              severity: str = "error") -> Signature:
    sig = Signature(declare(id, category="training_failure", severity=severity, title=title, doc=doc),
                    tuple(re.compile(p, re.I | re.S) for p in patterns), consequence)
    SIGNATURES.append(sig)
    return sig


def classify(text: str) -> Signature | None:
    """The first signature (catalogue order) whose pattern matches the failure text."""
    for sig in SIGNATURES:
        if sig.matches(text):
            return sig
    return None


signature("DDP820", "MASTER_ADDR / MASTER_PORT / RANK expected but not set", [
    r"environment variable (MASTER_ADDR|MASTER_PORT|RANK|WORLD_SIZE) expected, but not set"], doc="""
    What: init_process_group(init_method="env://") found a rendezvous variable missing.
    Why: The script was started without a launcher (plain `python train.py`), or a launcher that
    does not set torch's variables (mpirun without -x MASTER_ADDR).
    Fix: Start it with `ddp-doctor run --nproc-per-node N train.py` or torchrun; under mpirun pass
    `-x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500` and set RANK/WORLD_SIZE from OMPI_COMM_WORLD_*.
    """)

signature("DDP821", "Address already in use", [r"EADDRINUSE", r"address already in use"], doc="""
    What: The store or a backend could not listen on its port because another process holds it.
    Why: A previous job or a hung test still holds MASTER_PORT, or two jobs share one port.
    Fix: Stop the process holding the port (`ss -ltnp 'sport = :PORT'`) or pick another
    MASTER_PORT (torchrun --master-port, or --standalone on a single node).
    """)

signature("DDP822", "Default process group initialised twice", [
    r"trying to initialize the default process group twice"], doc="""
    What: init_process_group was called while a default process group already existed.
    Why: The script (or a library such as Trainer/Accelerate) already initialised it; a second call
    fails.
    Fix: Guard the call with `if not dist.is_initialized():`, or leave initialisation to the
    library that does it.
    """)

signature("DDP823", "DDP reduction not finished: unused parameters", [
    r"Expected to have finished reduction in the prior iteration"], doc="""
    What: DistributedDataParallel found parameters that received no gradient in an iteration.
    Why: Part of the model is not used in forward on some iterations (conditional branches, frozen
    heads), so DDP waits for gradients that never come.
    Fix: Pass find_unused_parameters=True to DistributedDataParallel (Trainer:
    ddp_find_unused_parameters=True), or make every parameter take part in the loss.
    """)
