"""The I/O-free core: every decision the router makes, as pure functions and programs.

Programs (generators, see :mod:`router.core.steps`) yield the requests to send and get
the answers back; the two front doors only carry the requests out. No module here
imports a database client: ``bson`` values only.

The kernel, which every concern may use:

* :mod:`~router.core.steps`: the requests and answers between core and drivers;
* :mod:`~router.core.policy`: error codes, retry policy, deadlines;
* :mod:`~router.core.nogc`, :mod:`~router.core.pseudonyms`: the collector's pause, users' keyed hashes;
* :mod:`~router.core.push`: what a writer pushes to live subscribers once its write is stored.

The concerns, each a package that says what it owns and may import, in the order they
build on each other: :mod:`~router.core.layouts` (the stored shapes), :mod:`~router.core.periods`,
:mod:`~router.core.writes`, :mod:`~router.core.reads`, :mod:`~router.core.fanout`,
:mod:`~router.core.social`, :mod:`~router.core.notify`, :mod:`~router.core.privacy` and
:mod:`~router.core.live`; :mod:`~router.core.settings` and :mod:`~router.core.calls` (each public
operation's checks and program) sit between them as the order in ``tests/unit/test_imports.py`` says.
"""
