"""What the users of feed-router need for their own tests, without a server.

* :mod:`router.testing.scripted`: :class:`~router.testing.scripted.ScriptedStore`, a model
  store that answers the requests the router's I/O-free core yields, and
  :func:`~router.testing.scripted.interleavings`, which runs several core programs against
  it in every order their requests can take. It proves rules about the core's logic (an
  edit racing a fan-out batch); it is not a stand-in for a server.

The local servers, the fault proxy, the demo and the benchmarks live in the repository's
``harness/`` folder, outside the installed package; nothing installed imports them.
"""
