"""The README and docs/ name only files that exist: every relative Markdown link, and every
repository path written in backticks (``orchestrator/...``, ``docs/measurements/...``). A moved
or renamed file shows up here instead of as a dead link a newcomer follows."""

from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
TOP = ("orchestrator", "serving", "benchmarks", "experiments", "docs", "scripts", "tests")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
CODE_PATH = re.compile(r"`((?:%s)/[^`\s]*)`" % "|".join(TOP))


def _exists(path: Path) -> bool:
    text = str(path)
    if "{" in text:  # brace lists, as the shell expands them: run{1,2}
        head, _, tail = text.partition("{")
        options, _, rest = tail.partition("}")
        return all(_exists(Path(head + option + rest)) for option in options.split(","))
    if any(c in text for c in "*?["):
        return bool(glob.glob(text))
    return path.exists()


def _dead(doc: Path) -> list[str]:
    text = doc.read_text()
    dead = []
    for target in LINK.findall(text):
        if "://" in target or target.startswith("mailto:"):
            continue
        if not _exists((doc.parent / target).resolve()):
            dead.append(f"link {target}")
    for target in CODE_PATH.findall(text):
        target = target.rstrip(".,:;")
        if "<" in target or "OUT" in target:  # placeholders: docs/measurements/<run>/, OUTDIR
            continue
        if not _exists(REPO / target):
            dead.append(f"path {target}")
    return dead


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_named_file_exists(doc: Path) -> None:
    assert _dead(doc) == [], f"{doc.relative_to(REPO)} names files that do not exist"


def _anchors(doc: Path) -> set[str]:
    """The heading anchors GitHub makes for ``doc`` (lower case, punctuation dropped, spaces to hyphens)."""
    found, fenced = set(), False
    for line in doc.read_text().splitlines():
        fenced = fenced != line.startswith("```")
        if not fenced and line.startswith("#"):
            found.add(re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-"))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_anchor_names_a_heading(doc: Path) -> None:
    """A section moved to another page leaves no link to its old anchor (issue 58 moved docs/sweep.md's)."""
    dead = []
    for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", doc.read_text()):
        page = (doc.parent / target).resolve() if target else doc
        if "://" not in target and page.suffix == ".md" and page.exists() and anchor not in _anchors(page):
            dead.append(f"{target}#{anchor}")
    assert dead == [], f"{doc.relative_to(REPO)} links to headings that do not exist"


def test_the_sweep_page_is_a_reference() -> None:
    """docs/sweep.md stays the spec reference a user reads: the statistics and the search's internals live in
    docs/design/, docs/confirmation.md and docs/search-efficiency.md (issue 58)."""
    assert len((REPO / "docs" / "sweep.md").read_text().splitlines()) < 400


def test_the_readme_is_a_front_door() -> None:
    """At most ~200 lines: the rest lives in docs/ (issue 21)."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 200
