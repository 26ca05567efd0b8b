"""The README is the landing page: short, and a way into every page of the docs site."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def _nav_pages(node: object) -> list[str]:
    """Every page mkdocs.yml's nav lists, relative to docs/."""
    if isinstance(node, str):
        return [node] if node.endswith(".md") else []
    if isinstance(node, dict):
        return [page for value in node.values() for page in _nav_pages(value)]
    if isinstance(node, list):
        return [page for value in node for page in _nav_pages(value)]
    return []


def test_the_readme_is_under_250_lines() -> None:
    assert len(README.splitlines()) < 250


def test_the_readme_links_every_page_of_the_site() -> None:
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)(?:#[^)]*)?\)", README))
    pages = {f"docs/{page.relative_to(REPO / 'docs').as_posix()}" for page in (REPO / "docs").rglob("*.md")}
    assert pages, "no page under docs/"
    assert pages - linked == set(), "pages the README does not link"
    assert linked - pages == set(), "README links to pages that do not exist"


def test_the_site_nav_lists_every_page() -> None:
    # mkdocs.yml names the hook with a !!python tag nowhere; a plain safe_load reads it.
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    listed = {f"docs/{page}" for page in _nav_pages(nav)}
    pages = {f"docs/{page.relative_to(REPO / 'docs').as_posix()}" for page in (REPO / "docs").rglob("*.md")}
    assert listed == pages
