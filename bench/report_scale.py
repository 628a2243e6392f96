"""What the reporting rank's end of a preflight costs as the world grows: the cross_rank checks,
build_report and render_text over a simulated world of N ranks, 8 a node, with the problems a big
job has (tests/helpers/scale_world.py: the views the real view builder makes, each rank's final
findings as the real checks make them, the world tests/report/test_report_at_scale.py checks).

    python bench/report_scale.py [--ranks 256 1024 4096] [--rounds 3]

Per world size: the median seconds of each part over --rounds rounds (the world is built once, not
timed), their total, and the total per rank as a ratio to the first size's (1.0: linear in the
ranks; N log N shows as a slow rise, N^2 as the ratio of the sizes), then the size of the JSON report
as written (report_json) and the text's lines. Aim: O(N log N) or better, so the ratio
stays near 1.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # the world builder the test uses

from helpers.scale_world import build_world, reporting_rank  # noqa: E402

from ddp_doctor.report.sinks import report_json  # noqa: E402

PER_NODE = 8
PARTS = ("cross_rank", "build_report", "render_text")


def measure(ranks: int, rounds: int) -> tuple[dict[str, float], int, int]:
    """({part: median seconds, "total": ...}, bytes of the JSON report, lines of the text)."""
    world = build_world(max(1, ranks // PER_NODE), PER_NODE)
    runs = [reporting_rank(world) for _ in range(rounds)]
    seconds = {p: statistics.median(v.seconds[p] for v in runs) for p in PARTS}
    seconds["total"] = statistics.median(sum(v.seconds.values()) for v in runs)
    last = runs[-1]
    return seconds, len(report_json(last.report)), len(last.text.splitlines())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", nargs="+", type=int, default=[256, 1024, 4096])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"{'ranks':>6} {'cross_rank s':>12} {'build_report s':>14} {'render_text s':>13} {'total s':>8} "
          f"{'per rank vs first':>17} {'report bytes':>12} {'text lines':>10}")
    base = None
    for n in args.ranks:
        seconds, size, lines = measure(n, args.rounds)
        per_rank = seconds["total"] / n
        base = base or per_rank
        print(f"{n:>6} {seconds['cross_rank']:>12.4f} {seconds['build_report']:>14.4f} "
              f"{seconds['render_text']:>13.4f} {seconds['total']:>8.4f} {per_rank / base:>17.2f} "
              f"{size:>12} {lines:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
