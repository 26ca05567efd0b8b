"""feed-router: store and read social feeds across MongoDB clusters split by time.

Example::

    from router import FeedRouter, FeedItem, data_key

    with FeedRouter.from_yaml("clusters.yaml") as feeds:
        feeds.write(FeedItem(receiver_id=7, sender_id=3, event_time=now, type=1,
                             data={"fabula_id": 42}, data_key=data_key("fabula", 42)))
        page = feeds.read(7)

``AsyncFeedRouter`` offers the same operations as coroutines, on pymongo's
``AsyncMongoClient``. Both run the same I/O-free core (:mod:`router.core`).
"""

import logging

from .aio import AsyncFeedRouter
from .config import ClusterConfig, RouterConfig, load_config, parse_config
from .core.fanout import FanOutProgress, FanOutResult, JobStatus
from .core.privacy import ErasureProgress, ErasureResult, ErasureStatus, ExportProgress
from .core.notify import Group, GroupBy, GroupPage, Unseen, UnseenGroups
from .core.social import BackfillResult, PublishResult
from .cursor import Position
from .errors import (
    ClusterError,
    ClusterRetired,
    ClusterUnavailable,
    ConfigError,
    ConfigProblem,
    DeleteFailed,
    ErasureFailed,
    FanOutConflict,
    FanOutFailed,
    GroupsUnsupported,
    InvalidBatch,
    InvalidCursor,
    InvalidItem,
    ItemDeleted,
    BucketsFull,
    UnknownLayout,
    ItemRefused,
    MetadataError,
    MigrationError,
    NoClusterForTime,
    PeriodChangeRefused,
    PushNotConfigured,
    RequestRefused,
    RolloverError,
    RouterClosed,
    RouterError,
    SenderErased,
    StaleMetadata,
    UpdateFailed,
    WriteFailed,
    WrongEventLoop,
)
from .exports import ExportResult
from .fanout.tasks import AsyncFanOutExecutor, AsyncFanOutHandle
from .fanout.threads import FanOutExecutor, FanOutHandle
from .ids import copy_id, data_key, object_id_for, outbox_id
from .live import AsyncSubscription, DeletedItem, LiveEvent, NewItem, Resync, Subscription, UpdatedItem, live_cursor
from .model import Activity, ClusterMeta, FeedItem, Page
from .sync import FeedRouter
from .timemap import ReadWindow, TimeMap

__all__ = [
    "Activity",
    "AsyncFanOutExecutor",
    "AsyncFanOutHandle",
    "AsyncFeedRouter",
    "AsyncSubscription",
    "BackfillResult",
    "ClusterConfig",
    "ClusterError",
    "ClusterMeta",
    "ClusterRetired",
    "ClusterUnavailable",
    "ConfigError",
    "ConfigProblem",
    "DeleteFailed",
    "DeletedItem",
    "ErasureFailed",
    "ErasureProgress",
    "ErasureResult",
    "ErasureStatus",
    "ExportProgress",
    "ExportResult",
    "FanOutConflict",
    "FanOutExecutor",
    "FanOutFailed",
    "FanOutHandle",
    "FanOutProgress",
    "FanOutResult",
    "FeedItem",
    "FeedRouter",
    "Group",
    "GroupBy",
    "GroupPage",
    "GroupsUnsupported",
    "InvalidBatch",
    "InvalidCursor",
    "InvalidItem",
    "ItemDeleted",
    "BucketsFull",
    "UnknownLayout",
    "ItemRefused",
    "JobStatus",
    "LiveEvent",
    "MetadataError",
    "MigrationError",
    "NewItem",
    "NoClusterForTime",
    "Page",
    "PeriodChangeRefused",
    "Position",
    "PublishResult",
    "PushNotConfigured",
    "ReadWindow",
    "RequestRefused",
    "Resync",
    "RolloverError",
    "RouterClosed",
    "RouterConfig",
    "RouterError",
    "SenderErased",
    "StaleMetadata",
    "Subscription",
    "TimeMap",
    "Unseen",
    "UnseenGroups",
    "UpdateFailed",
    "UpdatedItem",
    "WriteFailed",
    "WrongEventLoop",
    "__version__",
    "copy_id",
    "data_key",
    "live_cursor",
    "load_config",
    "object_id_for",
    "outbox_id",
    "parse_config",
]

__version__ = "0.2.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())
