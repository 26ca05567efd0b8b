"""Every ```python block of the docs site and the README runs, against the session's real servers.

Blocks run page by page, in the order they appear, in one namespace per page (so a page can
set up a router or a follower store once and use it in later blocks), from a temporary folder
whose ``clusters.yaml`` names the three session servers with their periods registered and a
local Redis as the Celery broker and the live feeds' Redis. A block that must not run is fenced with another language
(``sh``, ``yaml``, ``text``, ``js``); a fence with no language is refused, so no Python block
hides from this test. Routers a page leaves open are closed after it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from router import FeedRouter, RouterConfig
from harness.localservers import LocalClusters
from harness.redis import LocalRedis

from .conftest import register

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]
#: A fenced block, at any indentation (inside a list item or an admonition too).
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.MULTILINE | re.DOTALL)
#: The fence languages a page may use; only ``python`` runs.
LANGUAGES = {"python", "sh", "yaml", "text", "js"}


def blocks(page: Path) -> list[tuple[str, int, str]]:
    """Every fenced block of *page*: its language, the line its code starts on, its code (dedented)."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        indent = match.group("indent")
        body = "".join(line[len(indent):] if line.startswith(indent) else line
                       for line in match.group("body").splitlines(keepends=True))
        found.append((match.group("lang").strip(), text.count("\n", 0, match.start()) + 2, body))
    return found


def python_blocks(page: Path) -> list[tuple[int, str]]:
    return [(line, code) for lang, line, code in blocks(page) if lang == "python"]


RUNNABLE = [page for page in PAGES if python_blocks(page)]


def page_id(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


@pytest.fixture(scope="module")
def broker() -> Iterator[LocalRedis]:
    """A local Redis, the Celery broker of the examples' clusters.yaml."""
    with LocalRedis() as local:
        yield local


def clusters_yaml(config: RouterConfig, servers: LocalClusters, broker: LocalRedis) -> str:
    """The clusters.yaml of *config* (this test's database on the session's servers), with the broker, which also
    carries the live feeds' pushes (under a prefix of this database's)."""
    return yaml.safe_dump({
        "database": config.database,
        "clusters": [{"name": spec.name, "uri": uri} for spec, uri in zip(config.clusters, servers.uris)],
        "celery": {"broker": broker.url},
        "push": {"redis": broker.url, "prefix": config.database},
    }, sort_keys=False)


def test_every_fence_names_a_language_the_test_knows() -> None:
    for page in PAGES:
        for lang, line, _ in blocks(page):
            assert lang in LANGUAGES, f"{page_id(page)}:{line}: fence language {lang!r} (known: {sorted(LANGUAGES)})"


def test_the_docs_have_examples_to_run() -> None:
    assert len(RUNNABLE) >= 10, [page_id(p) for p in RUNNABLE]
    assert sum(len(python_blocks(page)) for page in RUNNABLE) >= 20


@pytest.mark.parametrize("page", RUNNABLE, ids=page_id)
def test_examples_run(page: Path, servers: LocalClusters, broker: LocalRedis, registered_database: None,
                      make_config: Callable[..., RouterConfig],
                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config()
    register(config)
    (tmp_path / "clusters.yaml").write_text(clusters_yaml(config, servers, broker))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MONGODB_URI", servers.uris[0])  # the server a page's stand-alone script talks to
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    try:
        for line, code in python_blocks(page):
            exec(compile(code, f"{page_id(page)}:{line}", "exec"), namespace)  # noqa: S102 - the docs' own examples
    finally:
        for value in list(namespace.values()):
            if isinstance(value, FeedRouter):  # async routers close in their own loops (async with)
                value.close()
