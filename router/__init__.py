"""feed-router: store and read fan-out-on-write feeds across MongoDB clusters split by time.

Example::

    from router import FeedRouter, FeedItem, data_key

    with FeedRouter.from_yaml("clusters.yaml") as feeds:
        feeds.write(FeedItem(receiver_id=7, sender_id=3, event_time=now, type=1,
                             data={"fabula_id": 42}, data_key=data_key("fabula", 42)))
        page = feeds.read(7)
"""

import logging

from .config import ClusterConfig, RouterConfig, load_config, parse_config
from .cursor import Position
from .errors import (
    ClusterRetired,
    ClusterUnavailable,
    ConfigError,
    ConfigProblem,
    DeleteFailed,
    FanOutConflict,
    FanOutFailed,
    InvalidCursor,
    InvalidItem,
    MetadataError,
    MigrationError,
    NoClusterForTime,
    PeriodChangeRefused,
    RolloverError,
    RouterError,
    StaleMetadata,
    WriteFailed,
)
from .fanout import Activity, FanOutExecutor, FanOutHandle, FanOutProgress, FanOutResult
from .ids import copy_id, data_key, object_id_for
from .model import ClusterMeta, FeedItem, Page
from .router import FeedRouter
from .timemap import ReadWindow, TimeMap

__all__ = [
    "Activity",
    "ClusterRetired",
    "FanOutConflict",
    "FanOutExecutor",
    "FanOutFailed",
    "FanOutHandle",
    "FanOutProgress",
    "FanOutResult",
    "MigrationError",
    "PeriodChangeRefused",
    "RolloverError",
    "StaleMetadata",
    "copy_id",
    "ClusterConfig",
    "ClusterMeta",
    "ClusterUnavailable",
    "ConfigError",
    "ConfigProblem",
    "DeleteFailed",
    "FeedItem",
    "FeedRouter",
    "InvalidCursor",
    "InvalidItem",
    "MetadataError",
    "NoClusterForTime",
    "Page",
    "Position",
    "ReadWindow",
    "RouterConfig",
    "RouterError",
    "TimeMap",
    "WriteFailed",
    "__version__",
    "data_key",
    "load_config",
    "object_id_for",
    "parse_config",
]

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())
