"""The README and docs/ stay true: the check table in docs/checks.md is the catalogue, the README's
test command is the one CI runs, the README stays short and its links to docs/ resolve."""
from __future__ import annotations

import re
from pathlib import Path

from ddp_doctor.cli.catalogue import catalogue_markdown

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
REGENERATE = "python tools/update_docs_checks.py"


def test_docs_check_table_matches_catalogue():
    text = (ROOT / "docs" / "checks.md").read_text()
    m = re.search(r"<!-- checks:start[^>]*-->\n(.*?)<!-- checks:end -->", text, re.S)
    assert m, "docs/checks.md lacks the checks:start / checks:end markers"
    assert m.group(1).strip() == catalogue_markdown().strip(), \
        f"docs/checks.md check table is stale: regenerate with `{REGENERATE}`"


def test_readme_has_no_check_table():
    assert "checks:start" not in README.read_text(), "the check table lives in docs/checks.md"


def test_readme_is_short():
    size = len(README.read_bytes())
    assert size <= 16000, f"README.md is {size} bytes; move reference material to docs/"


def test_readme_docs_links_exist():
    links = re.findall(r"\]\((docs/[^)#\s]+\.md)(?:#[^)]*)?\)", README.read_text())
    assert links, "README links to no docs/ page"
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, f"README links to missing docs pages: {missing}"


def test_every_docs_page_is_linked_from_readme():
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", README.read_text()))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"


def test_docs_relative_links_exist():
    for page in (ROOT / "docs").glob("*.md"):
        for link in re.findall(r"\]\(([^)#\s:]+\.md)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / link).resolve().is_file(), f"{page.name} links to missing {link}"


def test_ci_runs_the_readme_test_command():
    readme = README.read_text()
    command = re.search(r"## Tests\n\n```bash\n(.+?)\n```", readme).group(1).strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert command in ci.splitlines()
