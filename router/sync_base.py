"""What the sync door keeps besides its operations: its calls in flight, the map and its refresh thread, and how
it runs a core program (:class:`SyncDoorBase`, the base of :class:`~router.FeedRouter`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TypeVar

from .config import RouterConfig
from .core import calls
from .core.periods import Routing
from .core.settings import Settings
from .core.steps import Program
from .errors import RouterClosed, RouterError
from .fanout.threads import FanOutExecutor
from .observe import Event, Observer
from .storage.clusters import Clusters
from .timemap import TimeMap

__all__ = ["SyncDoorBase"]

log = logging.getLogger("router.sync")
T = TypeVar("T")


class _Calls:
    """Calls in flight, and the switch that refuses new ones once ``close()`` begins."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self.closed = False

    @contextmanager
    def call(self, name: str) -> Iterator[None]:
        with self._cond:
            if self.closed:
                raise RouterClosed(f"{name}(): this FeedRouter is closed")
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                if self.closed:  # close() waits (it set closed first, under this lock): wake it
                    self._cond.notify_all()

    def close(self, wait: float) -> bool:
        """Refuse new calls; wait up to *wait* seconds for the ones in flight; True if none is left."""
        with self._cond:
            self.closed = True
            return self._cond.wait_for(lambda: self._active == 0, timeout=wait)


class SyncDoorBase:
    """The calls in flight (what ``close()`` waits for), the map and its refresh thread, and :meth:`_run`, which runs
    a core program as one call. Set up by ``FeedRouter.__init__``."""

    config: RouterConfig
    settings: Settings
    _observe: Observer
    _clock: Callable[[], datetime]
    _calls: _Calls
    _refresh_lock: threading.Lock
    _clusters: Clusters
    _routing: Routing
    _fanouts: FanOutExecutor
    _stop: threading.Event
    _refresher: threading.Thread | None

    # -- state -------------------------------------------------------------------------

    @property
    def timemap(self) -> TimeMap:
        """The time map in use (replaced as a whole by :meth:`refresh`)."""
        return self._routing.timemap

    @property
    def routing(self) -> Routing:
        """The time map in use with the moment its load began and its horizon."""
        return self._routing

    @property
    def refreshed_at(self) -> datetime:
        """When the load of the map in use began (by the router's clock)."""
        return self._routing.loaded_at

    @property
    def clusters(self) -> Clusters:
        """The configured clusters and their clients."""
        return self._clusters

    @property
    def fanouts(self) -> FanOutExecutor:
        """Background fan-outs: at most ``fanout_workers`` jobs at once; closed by :meth:`close`."""
        return self._fanouts

    def _view(self) -> calls.View:
        return calls.View(self.config, self.settings, self._routing, tuple(self._clusters.names), self._clock())

    def _run(self, name: str, program: Program[T]) -> T:
        with self._calls.call(name), self._observe.call(name):
            return self._clusters.run(program)

    # -- refresh -----------------------------------------------------------------------

    def refresh(self) -> TimeMap:
        """Reload every cluster's metadata; the old map stays in use if this raises.

        A cluster that does not answer keeps its last known period. The map and the time
        its load began are replaced together, and never by an older load.
        """
        with self._calls.call("refresh"), self._observe.call("refresh"):
            return self._refresh().timemap

    def _refresh(self) -> Routing:
        with self._refresh_lock:
            started = self._clock()
            timemap = self._clusters.load_timemap(previous=self._routing.timemap)
            newer = self._routing.replaced_by(timemap, started)
            if newer is not None:
                self._routing = newer
                self._clusters.record(Event("timemap_loaded", started.timestamp()))
            return self._routing

    def _refresh_for_core(self) -> Routing | RouterError:
        try:
            return self._refresh()
        except RouterError as exc:
            return exc

    def _refresh_loop(self) -> None:
        interval = self.config.refresh_interval.total_seconds()
        while not self._stop.wait(interval):
            try:
                self.refresh()
            except RouterClosed:
                return
            except RouterError as exc:
                log.warning("metadata refresh failed; keeping the map loaded at %s: %s", self.refreshed_at.isoformat(), exc)

    def stop_refresh(self) -> None:
        """Stop the background refresh (the map stays as it is)."""
        self._stop.set()
        if self._refresher is not None and self._refresher is not threading.current_thread():
            self._refresher.join()
        self._refresher = None
