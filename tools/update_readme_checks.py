"""Regenerate the README's check table from the catalogue: python tools/update_readme_checks.py"""
from __future__ import annotations

import re
from pathlib import Path

from ddp_doctor.cli.app import catalogue_markdown

README = Path(__file__).resolve().parents[1] / "README.md"

text = README.read_text()
new = re.sub(r"(<!-- checks:start[^>]*-->\n)(.*?)(<!-- checks:end -->)",
             lambda m: m.group(1) + catalogue_markdown() + "\n" + m.group(3), text, flags=re.S)
README.write_text(new)
print("README check table updated" if new != text else "README check table already current")
