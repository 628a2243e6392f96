"""The README stays true: its check table is the catalogue, its test command is the one CI runs."""
from __future__ import annotations

import re
from pathlib import Path

from ddp_doctor.cli.app import catalogue_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_readme_check_table_matches_catalogue():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- checks:start[^>]*-->\n(.*?)<!-- checks:end -->", text, re.S)
    assert m, "README lacks the checks:start / checks:end markers"
    assert m.group(1).strip() == catalogue_markdown().strip(), \
        "README check table is stale: regenerate with `ddp-doctor list-checks --markdown`"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"## Tests\n\n```bash\n(.+?)\n```", readme).group(1).strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert command in ci.splitlines()
