"""`ddp-doctor list-checks` and `ddp-doctor explain`, and catalogue_markdown (docs/checks.md's
check table, from the same docstrings `explain` prints). None of them imports torch.
"""
from __future__ import annotations

import argparse
import json

from ddp_doctor import checks, registry
from ddp_doctor.cli.options import UsageError
from ddp_doctor.exit_codes import EXIT_OK

LIST_HELP = "list the check catalogue"
EXPLAIN_HELP = "explain one check: what it does, why it matters, how to fix it"


def add_list_parser(p: argparse.ArgumentParser) -> None:
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the catalogue as JSON")
    fmt.add_argument("--markdown", action="store_true", help="print the catalogue as a Markdown table")


def catalogue_markdown() -> str:
    """The README's check table, generated from the same docstrings `explain` prints."""
    rows = ["| ID | category | severity | cause / action | title | what it checks |", "|---|---|---|---|---|---|"]
    for c in sorted(checks.load_catalogue().values(), key=lambda c: c.id):
        what = c.sections.get("What", "").replace("|", "\\|")
        rows.append(f"| {docs_anchor_tag(c.id)}{c.id} | {c.category} | {c.severity_label} | "
                    f"{c.cause_class} / {c.action} | {c.title} | {what} |")
    for rid, why in sorted(registry.RETIRED.items()):
        rows.append(f"| {rid} | retired | | | | {why} |")
    return "\n".join(rows)


def docs_anchor_tag(cid: str) -> str:
    """The anchor of a check's row in docs/checks.md (`explain` points to it)."""
    return f'<a id="{cid.lower()}"></a>'


_ROW = "{id:<6}  {severity:<8} {category:<16} {stage:<10} {title}"
# What the "runs" column means (registry.STAGES), one line above the table.
RUNS_LEGEND = ("runs: local / group = on every rank, before / over the process group; cross_rank = on the "
               "reporting rank, across every rank's view; event = raised by ddp-doctor itself as it "
               "happens (rendezvous, a crashed check, training, a stop); job = by sagemaker-check, before launch")


def list_command(args: argparse.Namespace) -> int:
    entries = sorted(checks.load_catalogue().values(), key=lambda c: c.id)
    if args.markdown:
        print(catalogue_markdown())
        return EXIT_OK
    if args.json:
        print(json.dumps({"checks": [c.to_dict() for c in entries],
                          "retired": registry.RETIRED}, indent=2))
        return EXIT_OK
    print(RUNS_LEGEND)
    print(_ROW.format(id="ID", severity="severity", category="category", stage="runs", title="title"))
    for c in entries:
        print(_ROW.format(id=c.id, severity=c.severity, category=c.category, stage=c.stage, title=c.title))
    for rid, why in sorted(registry.RETIRED.items()):
        print(f"{rid}  retired: {why}")
    return EXIT_OK


def add_explain_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="a check ID, e.g. DDP101")


# The docstring sections every check has, printed even when empty; any further section a check's
# docstring has (e.g. "Severity" for an ID whose severity depends on the situation) follows them.
MAIN_SECTIONS = ("What", "Why", "Fix")


def explain_command(args: argparse.Namespace) -> int:
    cat = checks.load_catalogue()
    cid = args.id.strip().upper()
    if cid in registry.RETIRED:
        print(f"{cid}: retired. {registry.RETIRED[cid]}")
        return EXIT_OK
    if cid not in cat:
        near = [c for c in sorted(cat) if c.startswith(cid[:4])][:10]
        raise UsageError(f"no check {args.id!r}" + (f"; IDs nearby: {', '.join(near)}" if near else "")
                         + " (see `ddp-doctor list-checks`)")
    c = cat[cid]
    s = c.sections
    print(f"{c.id}: {c.title}\ncategory: {c.category}   severity: {c.severity_label}   runs: {c.stage}   "
          f"cause: {c.cause_class}   action: {c.action}\n")
    for name in (*MAIN_SECTIONS, *(k for k in s if k not in MAIN_SECTIONS)):
        print(f"{name}: {s.get(name, '')}\n")
    print(f"Docs: docs/checks.md#{c.id.lower()} in ddp-doctor's source (`ddp-doctor list-checks --markdown` "
          f"prints the same table)")
    return EXIT_OK
