"""The garbage collector around ddp-doctor's own startup (processes/collector.py), in a fresh
interpreter: freezing is process-wide, and pytest's own process keeps its collector as it is."""
from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import gc, weakref
    from ddp_doctor.processes.collector import garbage_of_block_collected, imports_uncollected

    class Node:
        pass

    collections = []
    gc.callbacks.append(lambda phase, info: phase == "stop" and collections.append(info["generation"]))
    with imports_uncollected():
        assert not gc.isenabled()
        many = [[Node()] for _ in range(50_000)]  # enough allocations to set off collections
    assert gc.isenabled() and collections == [], collections
    assert gc.get_freeze_count() >= 50_000  # what the block made is frozen
    with garbage_of_block_collected():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only a collection frees it
        gone = weakref.ref(a)
        del a, b
        assert gone() is not None
    assert gone() is None and gc.get_freeze_count() == 0  # collected, then nothing frozen
    print("ok")
""")


def test_imports_run_uncollected_then_frozen_and_a_blocks_cycles_are_gone_after_it():
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
