"""Fan-out engines: where batches of copies are written (threads, asyncio tasks, Celery workers).

What a batch does is decided once, in :mod:`router.core.fanout.plan`; the engines here only
schedule batches: :mod:`~router.fanout.threads` for ``FeedRouter``,
:mod:`~router.fanout.tasks` for ``AsyncFeedRouter``, and :mod:`~router.fanout.celery`
for workers on other machines.
"""
