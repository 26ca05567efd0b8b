"""Tools for testing code that uses feed-router against real servers: not part of the router itself.

* :mod:`router.testing.localservers`: start MongoDB-wire servers on loopback (mongod,
  or FerretDB built from its Go module) for tests, the demo and the benchmark.
* :mod:`router.testing.proxy`: a loopback TCP proxy that cuts chosen commands, to test
  behaviour under network blips.
* :mod:`router.testing.demo` and :mod:`router.testing.bench`: the demo and the benchmark.

Nothing in the router imports this package; only tests, the demo and the benchmark do.
"""
