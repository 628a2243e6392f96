"""Time of redact_text on large blobs (an exception message or a log tail that quotes a huge
unbroken string), as a ratio to one pass of a single simple regular expression over the same text,
measured side by side, at growing sizes.

    python bench/redact.py [--sizes 1 2 4 8] [--repeat 5]

The blob is the one of tests/report/test_redact.py (100,000 characters without a break, then
10,000 short words with dots and underscores, then a token), repeated `size` times. Timings
alternate (baseline, redact, baseline, redact, ...) so drift in machine load hits both; the figure
is the ratio of medians. Linear time shows as a ratio that stays flat as the size grows; a pattern
that backtracks shows as a ratio that grows with it.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time

from ddp_doctor.report.redact import redact_text

HF = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2"  # shaped like a Hugging Face token, never a real one
BLOB = ("x" * 100_000) + " " + ("abc_def.ghi " * 10_000) + HF
BASELINE = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")  # one linear pass: the cheapest redaction there is


def timed(fn, text: str) -> float:
    start = time.perf_counter()
    fn(text)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"{'size':>4} {'chars':>9} {'one regex ms':>13} {'redact_text ms':>15} {'ratio':>6}")
    for n in args.sizes:
        text = BLOB * n
        base, red = [], []
        for _ in range(args.repeat):
            base.append(timed(lambda t: BASELINE.sub("***", t), text))
            red.append(timed(lambda t: redact_text(t, env={}), text))
        if HF in redact_text(text, env={}):
            sys.exit("redact_text left the token in the blob")
        b, r = statistics.median(base), statistics.median(red)
        print(f"{n:>4} {len(text):>9} {b * 1e3:>13.2f} {r * 1e3:>15.2f} {r / b:>6.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
