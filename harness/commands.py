"""A pymongo command listener that records what a client sends while switched on.

Tests and the benchmark use it to count commands by name and by server (each local
cluster has its own port) and the documents finds return::

    log = CommandLog()
    router = FeedRouter(config, event_listeners=[log])
    log.on = True
    router.read(7, limit=50)
    assert log.total("find") == 1 and log.documents == 50

Servers are told apart by port alone, which suits the local clusters (one host, a port
each); the log keeps every command sent while on, so switch it on only around what is
counted.
"""

from __future__ import annotations

import threading
from collections.abc import Collection

import attrs
from pymongo import monitoring

__all__ = ["Command", "CommandLog"]

_READS = ("find", "getMore")


@attrs.frozen
class Command:
    """One started command: the server's port, the command's name and the collection it names."""

    port: int
    name: str
    collection: str


class CommandLog(monitoring.CommandListener):
    """Records started commands and counts the documents find/getMore return, while ``on``.

    ``on`` starts as given (off by default); ``commands`` lists what was started, in order;
    ``documents`` adds up the documents find and getMore replies carried (``replied``: and aggregate
    replies too); ``rounds`` and ``most_in_flight`` say how many of the commands went one after
    another and how many at once.
    """

    def __init__(self, *, on: bool = False) -> None:
        self.on = on
        self.commands: list[Command] = []
        self.documents = 0
        #: The documents every cursor reply carried (find, getMore and aggregate): what the client received.
        self.replied = 0
        #: How many commands started while no other was in flight: the calls' round trips one after another.
        self.rounds = 0
        #: The most commands in flight at once.
        self.most_in_flight = 0
        self._in_flight: set[tuple[int, object]] = set()
        self._lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.on:
            name = event.command_name
            target = event.command.get("collection") if name == "getMore" else event.command.get(name)
            port = int(event.connection_id[1] or 0)
            with self._lock:
                self.commands.append(Command(port, name, target if isinstance(target, str) else ""))
                self.rounds += not self._in_flight
                self._in_flight.add((event.request_id, event.connection_id))
                self.most_in_flight = max(self.most_in_flight, len(self._in_flight))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        with self._lock:
            self._in_flight.discard((event.request_id, event.connection_id))
        if self.on and event.command_name in (*_READS, "aggregate"):
            cursor = event.reply.get("cursor", {})
            returned = len(cursor.get("firstBatch", cursor.get("nextBatch", [])))
            self.replied += returned
            if event.command_name in _READS:
                self.documents += returned

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        with self._lock:
            self._in_flight.discard((event.request_id, event.connection_id))

    def count(self, name: str) -> dict[int, int]:
        """How many ``name`` commands each port was sent (ports sent none are absent)."""
        counts: dict[int, int] = {}
        for command in self.commands:
            if command.name == name:
                counts[command.port] = counts.get(command.port, 0) + 1
        return counts

    def total(self, name: str) -> int:
        """How many ``name`` commands were sent, to every port."""
        return sum(command.name == name for command in self.commands)

    def sent(self, port: int, *, names: Collection[str] | None = None) -> list[tuple[str, str]]:
        """The (command, collection) pairs sent to ``port``, in order; only commands in ``names`` if given."""
        return [(c.name, c.collection) for c in self.commands if c.port == port and (names is None or c.name in names)]

    def clear(self, *, documents: bool = True) -> None:
        """Forget the commands, and the document count unless ``documents=False``."""
        self.commands.clear()
        if documents:
            self.documents = self.replied = 0
