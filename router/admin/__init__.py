"""Operator tools: migrations, periods (add-cluster, retire), rollover and its scheduler.

Synchronous, used by the ``feedrouter`` command line and by operators' scripts; the
routers themselves only read what these write.
"""
