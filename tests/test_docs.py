"""Every Python code block of README.md and docs/**/*.md runs.

The blocks of one page run in order in one namespace (a later block may use what an earlier one defined),
in a temporary working directory (snippets that save a checkpoint write there).  A block preceded by an HTML
comment ``<!-- skip-test: reason -->`` (blank lines between them allowed) is not run: for the few that need
a real model, a GPU or the network.  A block that raises fails its page, naming the page and the block's line.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
_SKIP = re.compile(r"<!--\s*skip-test:\s*(.+?)\s*-->\s*$")


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """``(line, code, skip reason or None)`` of every ```python block of a markdown page, in order."""
    blocks = []
    for match in _FENCE.finditer(text):
        before = text[:match.start()].rstrip()
        skip = _SKIP.search(before.rsplit("\n", 1)[-1])
        blocks.append((text.count("\n", 0, match.start()) + 1, match[1], skip[1] if skip else None))
    return blocks


def test_block_extraction_and_skip_marker():
    page = ("text\n\n```python\nx = 1\n```\n\n<!-- skip-test: needs a GPU -->\n\n```python\ny = x\n```\n"
            "```\nnot python\n```\n")
    assert python_blocks(page) == [(3, "x = 1\n", None), (9, "y = x\n", "needs a GPU")]


def _runnable(page: Path) -> bool:
    return any(skip is None for _, _, skip in python_blocks(page.read_text()))


RUNNABLE = [page for page in PAGES if _runnable(page)]


def test_the_readme_and_the_docs_have_python_blocks():
    assert ROOT / "README.md" in RUNNABLE and len(RUNNABLE) >= 8


@pytest.mark.parametrize("page", RUNNABLE, ids=[str(p.relative_to(ROOT)) for p in RUNNABLE])
def test_python_blocks_run(page, tmp_path, monkeypatch):
    blocks = python_blocks(page.read_text())
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs:{page.name}"}
    for line, code, skip in blocks:
        if skip is None:
            exec(compile(code, f"{page.relative_to(ROOT)}:{line}", "exec"), namespace)


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_relative_links_point_at_files_and_headings_that_exist():
    broken = []
    for page in PAGES:
        for target in _LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken
