"""Every relative link in the docs lands: its file exists and, into a markdown file, its anchor is one of that
file's headings (GitHub's anchors) or an explicit `<a id=…>`. The docs are split by concern (docs/behaviour/,
docs/history/): a page moved or a heading renamed must not leave a reader at a dead link."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "localcluster" / "README.md",
         *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"```.*?```", re.S)
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"(#{1,6})\s+(.*?)\s*#*\s*$")


def without_fences(text: str) -> list[str]:
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text).splitlines()


def slug(heading: str) -> str:
    """GitHub's anchor: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in without_fences(path.read_text()):
        if heading := HEADING.match(line):
            base = slug(re.sub(r"`", "", heading.group(2)))
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
        found.update(re.findall(r'<a\s+(?:name|id)="([^"]+)"', line))
    return frozenset(found)


def broken(page: Path) -> list[str]:
    found = []
    for number, line in enumerate(without_fences(page.read_text()), 1):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z]+:", target) or target.startswith("//"):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page.resolve()
            if not dest.exists():
                found.append(f"{page.name}:{number}: no file {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                found.append(f"{page.name}:{number}: no heading {target}")
    return found


def test_every_relative_link_in_the_docs_lands():
    assert len(PAGES) > 10 and any(LINK.search(p.read_text()) for p in PAGES)
    assert [b for page in PAGES for b in broken(page)] == []


def test_a_link_to_a_heading_that_is_not_there_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Some `code` here\n\n[ok](#some-code-here) [no](#gone) [f](b.md)\n")
    assert [line.split(": ", 1)[1] for line in broken(tmp_path / "a.md")] == ["no heading #gone", "no file b.md"]
