"""The lab around feed-router: local servers, faults, the demo and the benchmarks. Not installed with the package.

Run from a checkout (``scripts/clusters``, ``scripts/demo``, ``scripts/bench``, the tests);
``scripts/bootstrap`` prepares what it needs.

* :mod:`harness.localservers`: start MongoDB-wire servers on loopback: FerretDB 2 on
  DocumentDB (the default; :mod:`harness.documentdb`), FerretDB 1 (:mod:`harness.ferretdb`)
  over a private PostgreSQL (:mod:`harness.postgres`) or SQLite, mongod, or
  mongo-java-server (:mod:`harness.javaserver`); its parts: ``clusters`` (the backends),
  ``server`` (one server's faults), ``process`` (ports, pids, stopping), ``errors``
  (``HarnessError``).
* :mod:`harness.redis`: a local ``redis-server`` (the broker) with kill/restart.
* :mod:`harness.proxy`: a loopback TCP proxy that cuts chosen commands, to test
  behaviour under network blips.
* :mod:`harness.commands`: ``CommandLog``, a pymongo command listener that counts
  commands by name and server port, and the documents finds return.
* :mod:`harness.fleet`: many periods (a database each) over a few servers.
* :mod:`harness.demo` and :mod:`harness.bench`: the demo and the benchmark.

Nothing in ``router`` imports this package.
"""
