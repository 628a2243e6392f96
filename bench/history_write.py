"""What writing the history costs a preflight (aim: under 50 ms): the time publish() spends in
history.from_report.record for a real preflight's report, each in a fresh process (the import of
sqlite3 and of the history code included; the report's publishing code is loaded first, as it is
in a preflight), side by side with the same process doing everything but the write; into a new
file, and into one that already holds 5,000 records.

    python bench/history_write.py [--report PATH] [--repeat 15]

Without --report a self-launched `ddp-doctor preflight --select communication` makes one first.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from _common import clean_env

CHILD = r"""
import json, sys, time
import ddp_doctor.report.publish  # loaded in any process that publishes a report
t0 = time.perf_counter()
rep = json.load(open(sys.argv[1]))
if sys.argv[3] == "write":
    from ddp_doctor.history.from_report import record
    said = record(rep, {"DDP_DOCTOR_HISTORY": sys.argv[2]})
    assert said is None, said
print(time.perf_counter() - t0)
"""


def timed(report: str, history: str, what: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, report, history, what], capture_output=True, text=True,
                         check=True, env=clean_env())
    return float(out.stdout.strip())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", default=None)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = args.report or os.path.join(tmp, "r.json")
        if not args.report:
            subprocess.run([sys.executable, "-m", "ddp_doctor", "preflight", "--select", "communication",
                            "--no-history", "--report", report], env=clean_env(), capture_output=True, check=False,
                           timeout=300)
        rep = json.load(open(report))
        print(f"report: {report} ({rep['status']}, {sum(1 for k in rep['measurements'] if k != 'check_seconds')} "
              f"measurement groups)")
        full = os.path.join(tmp, "full.sqlite")
        from ddp_doctor.history.database import History
        from ddp_doctor.history.from_report import records_of
        History(full).add(records_of(rep) * 5000)
        files = (("new file", lambda i: os.path.join(tmp, f"new{i}.sqlite")), ("5,000 records", lambda i: full))
        for label, make in files:
            base, write = [], []
            for i in range(args.repeat):  # interleaved: both see the same machine
                base.append(timed(report, make(i), "base"))
                write.append(timed(report, make(i), "write"))
            extra = statistics.median(write) - statistics.median(base)
            print(f"{label:14s} without {statistics.median(base) * 1000:6.1f} ms   with the write "
                  f"{statistics.median(write) * 1000:6.1f} ms   the write adds {extra * 1000:5.1f} ms (median of "
                  f"{args.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
