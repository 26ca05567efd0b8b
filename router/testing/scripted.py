"""Run core programs side by side without a server, in every order their requests can take.

The core is generator programs that yield requests (:mod:`router.core.steps`). To prove a
rule about *races* (an edit and a fan-out batch), :func:`interleavings` runs several
programs against one :class:`ScriptedStore` and, in turn, every order in which their
requests can reach the store: each request is one atomic step, as a single-document
operation is on a real server. The store answers only the request shapes the core sends
(equality, ``$in``, ``$ne``, ``$lt``, ``$lte``, ``$gt``, ``$or``; ``$set``), so it is a model for proofs of
the core's logic, never a stand-in for a server: storage behaviour is tested against real
servers in ``tests/integration``.

Example::

    for run in interleavings(lambda: [batch(), delete()]):
        assert run.store.count("feed", {"data_key": key}) == 0, run.order
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from ..core.steps import (
    Concurrently,
    Delete,
    Find,
    Insert,
    InsertOutcome,
    Program,
    Push,
    Refresh,
    Report,
    Sleep,
    Update,
    UpdateOutcome,
    WriteError,
)

__all__ = ["Run", "ScriptedStore", "interleavings", "run_alone", "sampled"]

DUPLICATE_KEY = 11000


def _copy(value: Any) -> Any:
    """A copy of a stored value: mappings and lists copied at every depth, the rest (immutable) shared."""
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _compare(value: Any, op: str, operand: Any) -> bool:
    if op == "$in":  # (an array field matches when one of its elements is in *operand*, as on a server)
        return value in operand or (isinstance(value, list) and any(v in operand for v in value))
    if op == "$ne":
        return bool(value != operand)
    if value is None:
        return False
    if op == "$lt":
        return bool(value < operand)
    if op == "$lte":
        return bool(value <= operand)
    if op == "$gt":
        return bool(value > operand)
    raise ValueError(f"ScriptedStore does not answer {op}")


def matches(doc: Mapping[str, Any], query: Mapping[str, Any]) -> bool:
    """True if *doc* matches *query* (top-level fields, equality or the operators above; or any of ``$or``'s)."""
    for field, want in query.items():
        if field == "$or":
            if not any(matches(doc, alternative) for alternative in want):
                return False
            continue
        value = doc.get(field)
        if isinstance(want, Mapping) and want and all(str(k).startswith("$") for k in want):
            if not all(_compare(value, op, operand) for op, operand in want.items()):
                return False
        elif value != want:
            return False
    return True


class ScriptedStore:
    """Collections of documents by ``(cluster, collection)``, changed only by the requests it answers."""

    def __init__(self) -> None:
        self.collections: dict[tuple[str, str], dict[Any, dict[str, Any]]] = {}
        #: Every request answered, in order.
        self.sent: list[Find | Insert | Delete | Update] = []

    def docs(self, cluster: str, collection: str) -> dict[Any, dict[str, Any]]:
        return self.collections.setdefault((cluster, collection), {})

    def find(self, cluster: str, collection: str, query: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The documents of one collection matching *query* (copies)."""
        return [_copy(d) for d in self.docs(cluster, collection).values() if matches(d, query)]

    def answer(self, request: Find | Insert | Delete | Update) -> Any:
        """Carry out one request atomically and return the core's answer to it."""
        self.sent.append(request)
        docs = self.docs(request.cluster, request.collection)
        if isinstance(request, Insert):
            errors = []
            for i, doc in enumerate(request.documents):
                if doc["_id"] in docs:
                    errors.append(WriteError(i, DUPLICATE_KEY, "duplicate key"))
                else:
                    docs[doc["_id"]] = _copy(doc)
            return InsertOutcome(write_errors=tuple(errors))
        chosen = [d for d in docs.values() if matches(d, request.filter)]
        if isinstance(request, Find):
            for field, direction in reversed(list(request.sort or ())):
                chosen.sort(key=lambda d: d[field], reverse=direction < 0)  # (the core sorts on fields every document has)
            if request.limit:
                chosen = chosen[:request.limit]
            return [_copy(d) for d in chosen]
        if isinstance(request, Delete):
            for d in chosen:
                del docs[d["_id"]]
            return len(chosen)
        if request.one:
            chosen = chosen[:1]
        modified = 0
        for d in chosen:
            changes = request.update.get("$set", {})
            if any(d.get(k) != v for k, v in changes.items()):
                modified += 1
                d.update(_copy(changes))
        return UpdateOutcome(len(chosen), modified)


@attrs.define
class _Thread:
    program: Program[Any]
    reply: Any = None
    started: bool = False
    request: Any = None
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    parent: _Thread | None = None
    children: list[_Thread] = attrs.Factory(list)


@attrs.frozen
class Run:
    """One finished interleaving: the store after it, each program's result (or the exception it raised), and
    the order its requests took (program index per step)."""

    store: ScriptedStore
    results: tuple[Any, ...]
    errors: tuple[BaseException | None, ...]
    order: tuple[int, ...]


def _advance(thread: _Thread) -> None:
    """Run *thread* until it yields a request that needs the store, or ends (answering the rest at once)."""
    while True:
        try:
            request = thread.program.send(thread.reply) if thread.started else next(thread.program)
        except StopIteration as stop:
            thread.done, thread.result = True, stop.value
            return
        except BaseException as exc:  # noqa: BLE001 - the program raised: it ends with that
            thread.done, thread.error = True, exc
            return
        thread.started = True
        if isinstance(request, (Report, Sleep, Push)):  # (a live push is answered at once, as a driver does)
            thread.reply = None
        elif isinstance(request, Refresh):
            raise ValueError("ScriptedStore does not refresh a time map")
        elif isinstance(request, Concurrently):
            thread.request = request
            thread.children = [_Thread(p, parent=thread) for p in request.programs]
            for child in thread.children:
                _advance(child)
            return
        else:
            thread.request = request
            return


def _runnable(thread: _Thread) -> list[_Thread]:
    """The threads under *thread* whose next request may go to the store now."""
    if thread.done:
        return []
    if thread.children:
        return [t for c in thread.children for t in _runnable(c)]
    return [thread]


def _settle(thread: _Thread) -> None:
    """Resume threads whose sub-programs have all ended."""
    for child in thread.children:
        _settle(child)
    if thread.children and all(c.done for c in thread.children):
        failed = next((c.error for c in thread.children if c.error is not None), None)
        results = [c.result for c in thread.children]
        thread.children = []
        if failed is not None:
            try:
                thread.program.throw(failed)
            except BaseException as exc:  # noqa: BLE001
                thread.done, thread.error = True, exc
                return
        thread.reply = results
        _advance(thread)
        _settle(thread)


def _run(make: Callable[[ScriptedStore], Sequence[Program[Any]]], choices: Sequence[int],
         store: ScriptedStore, draw: Callable[[int], int] | None = None) -> tuple[Run, list[int]]:
    """Run once, taking *choices* at the first decision points and the first option after (or what *draw* picks
    among the options); return the run and the number of options at each decision point."""
    roots = [_Thread(p) for p in make(store)]
    for t in roots:
        _advance(t)
    order: list[int] = []
    options: list[int] = []
    while True:
        ready = [(i, t) for i, root in enumerate(roots) for t in _runnable(root)]
        if not ready:
            break
        pick = choices[len(options)] if len(options) < len(choices) else draw(len(ready)) if draw is not None else 0
        options.append(len(ready))
        index, thread = ready[pick]
        order.append(index)
        thread.reply = store.answer(thread.request)
        _advance(thread)
        for root in roots:
            _settle(root)
    run = Run(store=store, results=tuple(r.result for r in roots), errors=tuple(r.error for r in roots),
              order=tuple(order))
    return run, options


def interleavings(
    make: Callable[[ScriptedStore], Sequence[Program[Any]]], *, setup: Callable[[ScriptedStore], None] | None = None,
    limit: int = 100_000,
) -> Iterator[Run]:
    """Every order in which the requests of the programs ``make(store)`` returns can reach a fresh store.

    *setup* fills each fresh store first. Programs are made anew for every run (a
    generator runs once). Raises :class:`RuntimeError` past *limit* runs.
    """
    choices: list[int] = []
    count = 0
    while True:
        store = ScriptedStore()
        if setup is not None:
            setup(store)
        run, options = _run(make, choices, store)
        count += 1
        if count > limit:
            raise RuntimeError(f"more than {limit} interleavings")
        yield run
        taken = list(choices) + [0] * (len(options) - len(choices))
        while taken and taken[-1] + 1 >= options[len(taken) - 1]:
            taken.pop()
        if not taken:
            return
        taken[-1] += 1
        choices = taken


def sampled(
    make: Callable[[ScriptedStore], Sequence[Program[Any]]], *, runs: int, seed: int = 0,
    setup: Callable[[ScriptedStore], None] | None = None,
) -> Iterator[Run]:
    """*runs* orders of the programs' requests drawn at random, each step's program picked uniformly among those
    ready (seeded: a failing order comes back): for races with too many orders to try every one."""
    rng = random.Random(seed)
    for _ in range(runs):
        store = ScriptedStore()
        if setup is not None:
            setup(store)
        yield _run(make, (), store, rng.randrange)[0]


def run_alone(program: Program[Any], store: ScriptedStore | None = None) -> tuple[Any, list[Any]]:
    """Run one program to its end on *store* (a fresh one by default); return its result and the requests it sent.

    Raises what the program raised.
    """
    target = store if store is not None else ScriptedStore()
    start = len(target.sent)
    run, _ = _run(lambda _s: [program], [], target)
    if run.errors[0] is not None:
        raise run.errors[0]
    return run.results[0], target.sent[start:]
