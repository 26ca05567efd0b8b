"""Tools for testing code that uses feed-router against real servers: not part of the router itself.

* :mod:`router.testing.localservers`: start MongoDB-wire servers on loopback (mongod,
  or FerretDB built from its Go module, over a local PostgreSQL or SQLite) for tests, the
  demo and the benchmark; its parts: ``clusters`` (the backends), ``server`` (one
  server's faults), ``ferretdb`` (build, command line), ``postgres`` (the private
  PostgreSQL), ``process`` (ports, pids, stopping), ``errors`` (``HarnessError``).
* :mod:`router.testing.javaserver`: mongo-java-server in memory, a second wire server that
  applies one document's filter and update atomically (FerretDB v1 does not).
* :mod:`router.testing.redis`: a local ``redis-server`` (the broker) with kill/restart.
* :mod:`router.testing.proxy`: a loopback TCP proxy that cuts chosen commands, to test
  behaviour under network blips.
* :mod:`router.testing.commands`: ``CommandLog``, a pymongo command listener that counts
  commands by name and server port, and the documents finds return.
* :mod:`router.testing.demo` and :mod:`router.testing.bench`: the demo and the benchmark.

Nothing in the router imports this package; only tests, the demo and the benchmark do.
"""
