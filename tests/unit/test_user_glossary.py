"""Every word a user reads has a user-glossary entry (issue 58).

The fixed list (arm, chain, visit, contender, gate, opening: words of the people who built spectune)
must be defined in ``docs/words.md`` wherever a user meets one: the guide, the README, the comments of
the shipped specs, and what ``spectune validate`` and ``spectune sweep --dry-run`` print for every
shipped spec. The project's origin story ("the seed's node", "the seed's hand-tuned set") appears in
none of them; a random seed (``search.seed``) is fine.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app

REPO = Path(__file__).resolve().parents[2]
WORDS_PAGE = REPO / "docs" / "words.md"
SPECS = sorted((REPO / "experiments").glob("*.yaml"))
FIXED = ("arm", "chain", "visit", "contender", "gate", "opening")
FIXED_WORD = re.compile(r"\b(%s)s?\b" % "|".join(FIXED), re.IGNORECASE)
ORIGIN_STORY = re.compile(r"\bseed's\b", re.IGNORECASE)
COMMENT = re.compile(r"(?:^|\s)#(.*)$")  # a YAML comment: '#' at a line's start or after a blank


def user_entries() -> set[str]:
    """Each word of each term the user glossary defines: the bold terms in its tables' first column
    (``| **arm**, **all-reduce path** | ...``), lower-cased, split into words."""
    words: set[str] = set()
    for line in WORDS_PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("|") and line.count("|") >= 3:
            for term in re.findall(r"\*\*(.+?)\*\*", line.split("|")[1]):
                words.update(re.findall(r"[a-z_]+", term.lower()))
    return words


def yaml_comments(path: Path) -> str:
    return "\n".join(m.group(1) for line in path.read_text(encoding="utf-8").splitlines()
                     if (m := COMMENT.search(line)))


@lru_cache(maxsize=None)
def cli_output(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), terminal_width=200)
    assert result.exit_code == 0, f"spectune {' '.join(args)}: exit {result.exit_code}\n{result.output[-3000:]}"
    return result.output


def _sources() -> list[tuple[str, object]]:
    sources: list[tuple[str, object]] = [
        ("docs/guide.md", lambda: (REPO / "docs" / "guide.md").read_text(encoding="utf-8")),
        ("README.md", lambda: (REPO / "README.md").read_text(encoding="utf-8")),
    ]
    for spec in SPECS:
        rel = str(spec.relative_to(REPO))
        sources.append((f"comments of {rel}", lambda spec=spec: yaml_comments(spec)))
        sources.append((f"spectune validate {rel}", lambda rel=rel: cli_output("validate", str(REPO / rel))))
        sources.append((f"spectune sweep --dry-run {rel}",
                        lambda rel=rel: cli_output("sweep", "--dry-run", str(REPO / rel))))
    return sources


SOURCES = _sources()


def test_every_fixed_word_has_a_user_entry() -> None:
    missing = [word for word in FIXED if word not in user_entries()]
    assert not missing, f"docs/words.md defines no {missing}: add a row to one of its tables"


@pytest.mark.parametrize(("name", "read"), SOURCES, ids=[name for name, _ in SOURCES])
def test_each_fixed_word_a_user_reads_maps_to_an_entry(name: str, read) -> None:
    text = read()
    assert text.strip(), f"{name} is empty: the test would read nothing"
    entries = user_entries()
    undefined = sorted({m.group(1).lower() for m in FIXED_WORD.finditer(text)} - entries)
    assert not undefined, f"{name} uses {undefined} without an entry in docs/words.md"


@pytest.mark.parametrize(("name", "read"), SOURCES, ids=[name for name, _ in SOURCES])
def test_no_origin_story(name: str, read) -> None:
    found = [text[max(0, m.start() - 40):m.end() + 40] for text in [read()] for m in ORIGIN_STORY.finditer(text)]
    assert not found, f"{name} speaks of the seed's node or set (say '8x RTX PRO 6000 (PCIe)'): {found}"


def test_the_scan_finds_the_words_it_checks() -> None:
    """The matcher is live: what a user reads holds the words of the list (plurals included), so an
    entry removed from docs/words.md fails above. ("gate" is only met where the removed chain gate is
    spoken of, so it is not required here.)"""
    seen = {m.group(1).lower() for _, read in SOURCES for m in FIXED_WORD.finditer(read())}
    assert set(FIXED) - {"gate"} <= seen, f"never seen: {set(FIXED) - {'gate'} - seen}"
    assert FIXED_WORD.search("2 contenders x 6 visits") and not FIXED_WORD.search("armed gateway chained")


def test_the_origin_story_matcher_spares_a_random_seed() -> None:
    assert ORIGIN_STORY.search("on the seed's node") and not ORIGIN_STORY.search("search.seed: 0, seed 0")
