"""What every measure shares: the periods, the sizes, a result row, and helpers that time things fairly."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import attrs
from pymongo import monitoring

from router.admin.indexes import create_feed_indexes
from router.admin.migrate import discover, migrate_cluster
from router.core.layouts import DEFAULT, LAYOUTS
from router.config import ClusterConfig, RouterConfig
from router.ids import data_key
from router.model import ClusterMeta, FeedItem
from router.storage.clusters import Cluster

UTC = timezone.utc
P0 = datetime(2024, 1, 1, tzinfo=UTC)
P1 = datetime(2024, 4, 1, tzinfo=UTC)
P2 = datetime(2024, 7, 1, tzinfo=UTC)
NOW = datetime(2024, 9, 1, tzinfo=UTC)
NAMES = ("cluster_1", "cluster_2", "cluster_3")
#: Each call's timeout where a measure writes tens of thousands of items at once: a write_many of 30,000 items can take
#: longer than the default 10 s on a loaded machine.
PATIENT = timedelta(seconds=120)


@attrs.frozen
class Sizes:
    """How big each measurement is."""

    writes: int
    cpu: int
    reps: int
    reads: int
    deletes: int
    fanout: int
    memory: tuple[int, int]
    #: Receivers and repetitions of the Celery scaling measure (a couple of minutes in full).
    celery: tuple[int, int]
    #: Items per layout, receivers they are spread over, fan-out receivers and repetitions of the layouts measure.
    layouts: tuple[int, int, int, int] = (100_000, 50, 5_000, 3)
    #: The feed sizes whose newest page is timed, in each layout.
    feed_sizes: tuple[int, ...] = (100, 1_000, 20_000)
    #: Copies of the post one delete removes, and receivers of the fan-out an update races.
    big_edits: tuple[int, int] = (400_000, 40_000)
    #: The user one erasure removes: followers, posts (each pushed to every follower) and items received.
    erase: tuple[int, int, int] = (10_000, 1_000, 1_000)
    #: Items of the big group in a page of 20 groups.
    group: int = 100_000
    #: Deletes timed one after another in each repetition of ``delete_ratio``.
    delete_round: int = 8
    #: Reads at once, of different receivers, in ``async_reads`` and the doors' rows.
    readers: int = 200


SIZES = {
    "full": Sizes(writes=30_000, cpu=100_000, reps=5, reads=50, deletes=300, fanout=1_000_000, memory=(100_000, 1_000_000),
                  celery=(50_000, 3), layouts=(100_000, 50, 5_000, 3)),
    # Small: checks that every measure runs and reports (tests/integration/test_bench.py); its figures judge nothing.
    "small": Sizes(writes=1_000, cpu=5_000, reps=1, reads=20, deletes=30, fanout=2_000, memory=(1_000, 4_000),
                   celery=(1_000, 1), layouts=(2_000, 2, 300, 1), feed_sizes=(20, 200), big_edits=(5_000, 2_000),
                   erase=(200, 30, 50), group=2_000, delete_round=2, readers=50),
}


@attrs.frozen
class Result:
    """One measurement: per-repetition figures, the ratio per repetition, and the target verdict."""

    name: str
    what: str
    unit: str
    router: list[float]
    raw: list[float]
    ratios: list[float]
    target: str
    passed: bool
    note: str = ""

    @property
    def judged(self) -> bool:
        """Whether the row has a target (``"-"``: a figure reported, not judged)."""
        return self.target != "-"

    def row(self) -> str:
        def span(xs: list[float]) -> str:
            if not xs:
                return "-"
            return f"{statistics.median(xs):,.3g} [{min(xs):,.3g} - {max(xs):,.3g}]"

        return (f"| {self.what} | {span(self.router)} | {span(self.raw)} | {self.unit} | {span(self.ratios)} "
                f"| {self.target} | {self.verdict} |")

    @property
    def verdict(self) -> str:
        """PASS, FAIL, or ``reported`` for a row without a target."""
        return "reported" if not self.judged else "PASS" if self.passed else "FAIL"


def bench_config(uris: Sequence[str], database: str, *, listener: monitoring.CommandListener | None = None) -> RouterConfig:
    options: dict[str, Any] = {"event_listeners": [listener]} if listener is not None else {}
    return RouterConfig(
        database=database,
        clusters=tuple(ClusterConfig(name=n, uri=u, options=options) for n, u in zip(NAMES, uris)),
    )


def with_client_options(config: RouterConfig, **options: Any) -> RouterConfig:
    """*config* with *options* added to every cluster's driver options (over those it has)."""
    clusters = tuple(attrs.evolve(c, options={**c.options, **options}) for c in config.clusters)
    return attrs.evolve(config, clusters=clusters)


def register(config: RouterConfig) -> None:
    """Migrate the clusters of *config* and give them [P0, P1), [P1, P2), [P2, open), in order."""
    migrations = discover()
    for spec, (start, end) in zip(config.clusters, ((P0, P1), (P1, P2), (P2, None))):
        cluster = Cluster(spec, config)
        try:
            migrate_cluster(cluster, config, migrations)
            cluster.write_meta(ClusterMeta(name=spec.name, start_date=start, end_date=end, creator_name="bench"))
            create_feed_indexes(cluster, LAYOUTS[DEFAULT])  # as adding a period does
        finally:
            cluster.close()


def make_items(n: int, *, receivers: int = 5000, start: datetime = P0, end: datetime = NOW, key_offset: int = 0) -> list[FeedItem]:
    step = (end - start) / n
    return [
        FeedItem(receiver_id=1_000_000 + i % receivers, sender_id=1_000_765, event_time=start + step * i, type=1,
                 data={"fabula_id": key_offset + i}, data_key=data_key("fabula", key_offset + i))
        for i in range(n)
    ]


def timed(fn: Callable[[], Any]) -> float:
    """The seconds *fn* takes, started with the young generations collected, so that no collection of what came
    before lands in it. (Not a full collection: in a test worker that has run hundreds of tests, one took 250 ms, and
    the small benchmark's reads each paid one; :func:`interleave` makes one per measure.)"""
    gc.collect(1)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cpu_timed(fn: Callable[[], Any]) -> float:
    """The process's CPU seconds *fn* takes (what a measure of CPU alone wants: not the time others' load takes);
    started as :func:`timed` starts."""
    gc.collect(1)
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def interleave(reps: int, router: Callable[[], float], raw: Callable[[], float]) -> tuple[list[float], list[float]]:
    """Warm up both, collect all garbage once, then alternate which goes first in each repetition. One repetition
    (the small run, whose figures judge nothing) has no warm-up: it checks that the measure runs."""
    if reps > 1:
        router()
        raw()
    gc.collect()
    r_out, w_out = [], []
    for rep in range(reps):
        if rep % 2:
            w_out.append(raw())
            r_out.append(router())
        else:
            r_out.append(router())
            w_out.append(raw())
    return r_out, w_out
