"""Storage: where the core's requests meet pymongo, one module per way of waiting.

:mod:`~router.storage.requests` maps each request onto a collection call, once;
:mod:`~router.storage.clusters` runs programs on threads for ``FeedRouter`` and
:mod:`~router.storage.aclusters` on asyncio for ``AsyncFeedRouter``;
:mod:`~router.storage.errors` sorts driver errors into the retry policy's classes.
"""
