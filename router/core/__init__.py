"""The I/O-free core: every decision the router makes, as pure functions and programs.

Programs (generators, see :mod:`router.core.steps`) yield the requests to send and get
the answers back; the two front doors only carry the requests out. No module here
imports a database client: ``bson`` values only.

* :mod:`~router.core.steps`: the requests and answers between core and drivers;
* :mod:`~router.core.policy`: error codes, retry policy, deadlines;
* :mod:`~router.core.periods.routing`: the chooser and the horizon rule;
* :mod:`~router.core.writes.checks`: the input rules;
* :mod:`~router.core.layouts`: the stored shape of copies, per period (copies, buckets), and the outbox;
* :mod:`~router.core.writes.fence`: the edit fence that running fan-outs read;
* :mod:`~router.core.fanout.checkpoint`, :mod:`~router.core.fanout.tally`: fan-out checkpoints and results;
* :mod:`~router.core.writes.insert`, :mod:`~router.core.reads.pages`, :mod:`~router.core.writes.edits`,
  :mod:`~router.core.fanout.plan`, :mod:`~router.core.periods.metadata`, :mod:`~router.core.social.publish`,
  :mod:`~router.core.notify.seen`: the operations;
* :mod:`~router.core.calls`: the public operations' argument checks, one function each.
"""
