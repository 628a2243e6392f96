"""Regenerate the check table in docs/checks.md from the catalogue: python tools/update_docs_checks.py"""
from __future__ import annotations

import re
from pathlib import Path

from ddp_doctor.cli.catalogue import catalogue_markdown

CHECKS = Path(__file__).resolve().parents[1] / "docs" / "checks.md"

text = CHECKS.read_text()
new = re.sub(r"(<!-- checks:start[^>]*-->\n)(.*?)(<!-- checks:end -->)",
             lambda m: m.group(1) + catalogue_markdown().strip() + "\n" + m.group(3), text, flags=re.S)
if new == text and "<!-- checks:end -->" not in text:
    raise SystemExit("docs/checks.md lacks the checks:start / checks:end markers")
CHECKS.write_text(new)
print("docs/checks.md check table updated" if new != text else "docs/checks.md check table already current")
