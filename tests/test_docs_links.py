"""Every relative link of README.md and the Markdown under docs/ points at a file of this checkout, and a link's
``#anchor`` at a heading of the file it names (GitHub's heading slugs). A moved page or a renamed heading broke links
silently; the report's own links are checked by the end-to-end run test."""

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# an inline link or image target, with an optional title: [text](target "title"), ![alt](target)
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)  # [label]: target "title"
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1", re.S | re.M)
INDENTED = re.compile(r"(?:^\n)((?: {4,}|\t).*\n?)+", re.M)  # an indented code block after a blank line


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped (``-`` and ``_`` kept), spaces as
    hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose(page: Path) -> str:
    """The page without its code blocks (fenced with backticks or tildes, or indented after a blank line)."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return INDENTED.sub("\n", text)


def anchors(page: Path) -> set[str]:
    text = prose(page)
    seen: dict[str, int] = {}
    out = set()
    for h in re.findall(r"^#{1,6}\s+(.*)$", text, re.M):
        s = slug(h)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(page: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", prose(page))  # code spans hold example syntax, not links
    return LINK.findall(text) + REFDEF.findall(text)


def test_slug_follows_github():
    assert slug("`loopscale --version`") == "loopscale---version"
    assert slug("How the fit works, and its limits") == "how-the-fit-works-and-its-limits"
    assert slug("From a laptop to a cluster (same spec)") == "from-a-laptop-to-a-cluster-same-spec"
    assert slug("4. A multi-node cluster on one machine (`ray.cluster_utils.Cluster`)") == (
        "4-a-multi-node-cluster-on-one-machine-raycluster_utilscluster")


def test_links_finds_every_link_form_outside_code(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        '[a](one.md "title") and [![img](pic.png)](two.md) and [x][r]\n\n[r]: three.md\n\n'
        "```\n[no](fenced.md)\n```\n\n~~~\n[no](tilde.md)\n~~~\n\n    [no](indented.md)\n\n`[no](span.md)`\n",
        encoding="utf-8",
    )
    assert sorted(links(page)) == ["one.md", "pic.png", "three.md", "two.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor}")
    assert broken == [], f"{page.relative_to(ROOT)}: {broken}"
