"""The live feeds' web example (docs/live.md) end to end: the page's own app served by real uvicorn in a process of
its own, real Redis, real servers; a streaming HTTP client (httpx) and headless Chromium (Debian's package, over the
DevTools protocol) as its clients.

The app is the ``# live_app.py`` block of docs/live.md, written to a file as it is: what the docs show is what runs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import yaml

from router import FeedItem, FeedRouter, RouterConfig, data_key
from router.pushconfig import PushConfig
from harness.chromium import Chromium
from harness.process import free_ports, spawn_logged, stop_process
from harness.redis import LocalRedis

from .conftest import NOW, P2, register
from .test_docs import REPO, python_blocks

R = 1000386
WHEN = P2 + timedelta(days=20)


def app_source() -> str:
    """The app of docs/live.md: its ``# live_app.py`` block."""
    (code,) = [code for _, code in python_blocks(REPO / "docs" / "live.md") if code.startswith("# live_app.py")]
    return code


def post(n: int) -> FeedItem:
    return FeedItem(receiver_id=R, sender_id=1000765, event_time=WHEN + timedelta(seconds=n), type=1,
                    data={"text": f"post {n}"}, data_key=data_key("web", n))


@pytest.fixture(scope="module")
def redis_server() -> Iterator[LocalRedis]:
    with LocalRedis() as server:
        yield server


@pytest.fixture
def live_config(make_config: Callable[..., RouterConfig], redis_server: LocalRedis, db_name: str) -> RouterConfig:
    config = attrs.evolve(make_config(), push=PushConfig(redis=redis_server.url, prefix=db_name))
    register(config)
    return config


@pytest.fixture
def served(live_config: RouterConfig, tmp_path: Path) -> Iterator[str]:
    """The app under ``uvicorn live_app:app`` in a process of its own, on a free port; its base URL once it answers."""
    (tmp_path / "live_app.py").write_text(app_source())
    assert live_config.push is not None
    (tmp_path / "clusters.yaml").write_text(yaml.safe_dump({
        "database": live_config.database,
        "clusters": [{"name": c.name, "uri": c.uri} for c in live_config.clusters],
        "push": {"redis": live_config.push.redis, "prefix": live_config.push.prefix},
    }))
    (port,) = free_ports(1)
    process = spawn_logged([sys.executable, "-m", "uvicorn", "live_app:app", "--host", "127.0.0.1", "--port", str(port),
                            "--log-level", "warning"], tmp_path / "uvicorn.log", detached=False, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (tmp_path / "uvicorn.log").read_text()[-3000:]
            try:
                if httpx.get(f"{base}/feed/{R}", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "uvicorn did not answer within 60 s"
            time.sleep(0.1)
        yield base
    finally:
        stop_process(process, name="uvicorn", sig=signal.SIGTERM, grace=20)
        log = (tmp_path / "uvicorn.log").read_text()
        assert "Traceback" not in log, log[-3000:]


def events_of(response: httpx.Response) -> Iterator[tuple[str | None, str, dict[str, Any]]]:
    """(id, event, data) of each event of a Server-Sent Events stream."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line == "":
            if "event" in fields:
                yield fields.get("id"), fields["event"], json.loads(fields.get("data", "{}"))
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            fields[name] = value


def test_the_stream_carries_each_write_and_a_reconnection_misses_nothing(served: str, live_config: RouterConfig) -> None:
    """A write reaches the open stream; with the stream closed, three more are written; reconnecting with
    Last-Event-ID hands out exactly those three, oldest first, then what comes next."""
    with FeedRouter(live_config, clock=lambda: NOW) as feeds, httpx.Client(base_url=served, timeout=60) as client:
        with client.stream("GET", f"/feed/{R}/events") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            stream = events_of(response)
            assert next(stream)[1] == "ready"
            first = feeds.write(post(1))
            last_id, kind, data = next(stream)
            assert (kind, data) == ("item", {"id": str(first), "key": data_key("web", 1), "text": "post 1"})
        missed = [feeds.write(post(n)) for n in (2, 3, 4)]
        with client.stream("GET", f"/feed/{R}/events", headers={"Last-Event-ID": last_id or ""}) as response:
            stream = events_of(response)
            assert next(stream)[1] == "ready"
            assert [next(stream)[2]["id"] for _ in missed] == [str(i) for i in missed]
            later = feeds.write(post(5))
            feeds.delete(data_key("web", 2))
            assert next(stream)[2]["id"] == str(later)
            assert next(stream)[1:] == ("deleted", {"key": data_key("web", 2)})
        bad = client.get(f"/feed/{R}/events", params={"cursor": "c1.bogus"})
        assert bad.status_code == 400
        with pytest.raises(Exception) as read_error:
            feeds.read(R, cursor="c1.bogus")
        assert bad.json() == {"error": str(read_error.value)}


def test_the_page_shows_a_write_in_chromium(served: str, live_config: RouterConfig) -> None:
    """Headless Chromium loads the page: it shows the stored items, opens the stream, and a write appears at the top
    of the list."""
    with FeedRouter(live_config, clock=lambda: NOW) as feeds, Chromium() as browser:
        shown = feeds.write(post(1))
        tab = browser.open(f"{served}/feed/{R}")
        tab.wait_for("document.getElementById('feed') && document.getElementById('feed').dataset.ready === '1'")
        assert tab.evaluate("[...document.querySelectorAll('#feed li')].map(li => li.textContent)") == ["post 1"]
        written = feeds.write(post(2))
        tab.wait_for(f"document.getElementById('{written}') !== null")
        items = tab.evaluate("[...document.querySelectorAll('#feed li')].map(li => [li.id, li.textContent])")
        assert items == [[str(written), "post 2"], [str(shown), "post 1"]]
        feeds.update(data_key("web", 2), {"text": "post 2, edited"})
        tab.wait_for(f"document.getElementById('{written}').textContent === 'post 2, edited'")
