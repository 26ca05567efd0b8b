"""A sparse receiver's page over 10, 100 and 1,000 periods against a dense receiver's: latency and commands.

The periods are weekly, a database each, spread over the three servers
(:mod:`harness.fleet`); every period's feed holds one item of a filler receiver,
so each find is a real query of a real collection. The dense receiver has 60 items in
the newest period (its page of 50 is one find); the sparse one has one item there, so
its page of 50 must ask every period in the window to be exact. Each size is a router
over the newest *n* periods of one fleet, on the sync door; the two pages are timed in
turn (:func:`~harness.bench.common.interleave`), and a command listener counts
the sparse page's finds and how many of them went one after another (round trips).
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Sequence
from datetime import timedelta

import attrs

from router.config import RouterConfig
from router.ids import data_key
from router.model import FeedItem
from ..commands import CommandLog
from ..fleet import FIRST, drop_fleet, fleet_config, register_fleet
from .common import Result, interleave, timed

__all__ = ["SIZES", "SMALL_SIZES", "bench_sparse"]

SIZES = (10, 100, 1000)
SMALL_SIZES = (10, 30)
#: At the most periods, a sparse page may take this many times a dense page's latency (with :data:`BUDGET`).
TARGET = 5.0
#: The ``read.max_periods`` of the budgeted rows.
BUDGET = 8
SPARSE, DENSE, FILLER = 501, 502, 503


def _items(total: int) -> list[FeedItem]:
    """One filler item per period, one item of the sparse receiver and 60 of the dense one in the newest period."""
    newest = FIRST + timedelta(weeks=total - 1)

    def one(receiver: int, n: int, when: object) -> FeedItem:
        return FeedItem(receiver_id=receiver, sender_id=1, event_time=when, type=1, data={"n": n},  # type: ignore[arg-type]
                        data_key=data_key("sparse-bench", receiver * 10_000 + n))

    return ([one(FILLER, w, FIRST + timedelta(weeks=w, hours=1)) for w in range(total)]
            + [one(SPARSE, 0, newest + timedelta(hours=2))]
            + [one(DENSE, n, newest + timedelta(hours=3, minutes=n)) for n in range(60)])


def bench_sparse(uris: Sequence[str], sizes: Sequence[int] = SIZES, reps: int = 5) -> list[Result]:
    """Latency and commands of a sparse receiver's page against a dense one's, at each of *sizes* periods."""
    from router import FeedRouter

    total = max(sizes)
    fleet = fleet_config(uris, total, prefix=f"sparse_{uuid.uuid4().hex[:8]}")
    register_fleet(fleet)
    now = FIRST + timedelta(weeks=total - 1, days=3)
    sparse_s, dense_s, ratios, finds, rounds = [], [], [], [], []
    budget_s, budget_dense, budget_ratios, budget_finds = [], [], [], []
    try:
        with FeedRouter(fleet, clock=lambda: now, refresh=False) as router:
            router.write_many(_items(total))
        for n in sizes:
            config = RouterConfig(clusters=fleet.clusters[-n:], database=fleet.database)
            log = CommandLog()
            with FeedRouter(config, clock=lambda: now, refresh=False, event_listeners=[log]) as router:
                log.on = True
                page = router.read(SPARSE, limit=50)
                log.on = False
                assert [i.data["n"] for i in page.items] == [0] and page.next_cursor is None, page
                finds.append(float(log.total("find")))
                rounds.append(float(log.rounds))
                sparse, dense = interleave(reps, lambda: timed(lambda: router.read(SPARSE, limit=50)),
                                           lambda: timed(lambda: router.read(DENSE, limit=50)))
            sparse_s.append(statistics.median(sparse) * 1000)
            dense_s.append(statistics.median(dense) * 1000)
            ratios.append(sparse_s[-1] / dense_s[-1])
            bounded = attrs.evolve(config, max_periods=BUDGET)
            log = CommandLog()
            with FeedRouter(bounded, clock=lambda: now, refresh=False, event_listeners=[log]) as router:
                log.on = True
                page = router.read(SPARSE, limit=50)
                log.on = False
                assert [i.data["n"] for i in page.items] == [0] and (page.next_cursor is None) == (n <= BUDGET), page
                budget_finds.append(float(log.total("find")))
                sparse, dense = interleave(reps, lambda: timed(lambda: router.read(SPARSE, limit=50)),
                                           lambda: timed(lambda: router.read(DENSE, limit=50)))
            budget_s.append(statistics.median(sparse) * 1000)
            budget_dense.append(statistics.median(dense) * 1000)
            budget_ratios.append(budget_s[-1] / budget_dense[-1])
    finally:
        drop_fleet(fleet)
    sizes_text = ", ".join(f"{n:,}" for n in sizes)
    each = "; ".join(f"{n:,} periods: {s:.1f} ms against {d:.1f} ms ({r:.1f}x), {f:.0f} finds in {c:.0f} round trips"
                     for n, s, d, r, f, c in zip(sizes, sparse_s, dense_s, ratios, finds, rounds))
    return [
        Result(
            "sparse_page_latency", f"page of 50 for a receiver with 1 item, over {sizes_text} periods, every period "
            f"asked (raw column: a dense receiver's page at the same sizes)", "ms", sparse_s, dense_s, ratios, "-", True,
            note=f"sync door, medians of {reps}: {each}; an exact page asks every period that may hold an item, and "
                 "on local servers each find is CPU time, which waves do not save",
        ),
        Result(
            "sparse_page_budget", f"the same first page with read.max_periods {BUDGET} (it ends after {BUDGET} periods, "
            f"with a cursor to the next), over {sizes_text} periods; raw column: the dense page", "ms", budget_s,
            budget_dense, budget_ratios, f"<= {TARGET:g}x at {sizes[-1]:,} periods", budget_ratios[-1] <= TARGET,
            note="; ".join(f"{n:,} periods: {s:.1f} ms against {d:.1f} ms ({r:.1f}x), {f:.0f} finds"
                           for n, s, d, r, f in zip(sizes, budget_s, budget_dense, budget_ratios, budget_finds)),
        ),
        Result(
            "sparse_page_commands", f"finds (raw column: round trips one after another) of that sparse page over "
            f"{sizes_text} periods", "commands", finds, rounds, [], "-", True,
            note="one find per period in the window (exactness needs each asked), the older ones in waves",
        ),
    ]
