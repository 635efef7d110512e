"""volume-stream: event-driven file streams on Apache Spark.

Queue listeners feed file events into a versioned directory table (Delta Lake with Change Data
Feed); streams turn its versions into INSERT / DELETE / UPDATE_BEFORE / UPDATE_AFTER records,
with offsets that move only when a consumer's output is committed.

    import volume_stream as vs
    cat = vs.connect("./warehouse")

Heavy modules (Spark, Delta) load on first use, so `import volume_stream` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from volume_stream.errors import (
    AlreadyExistsError,
    ConfigError,
    ConsumeConflictError,
    ExpiredIteratorError,
    InvalidInputError,
    InventoryError,
    NotFoundError,
    SourceError,
    SqlError,
    SqlSyntaxError,
    StaleStreamError,
    TrimmedDataError,
    UnsupportedFeatureError,
    VolumeStreamError,
    WarehouseError,
)

__version__ = "0.1.0"

_LAZY = {
    "connect": "volume_stream.catalog",
    "Catalog": "volume_stream.catalog",
    "Batch": "volume_stream.catalog",
    "RefreshMetrics": "volume_stream.catalog",
    "LocalNotification": "volume_stream.volumes.notifications",
    "FileEvent": "connectors.events",
    "file_udf": "volume_stream.pipelines.udf",
    "FileRecord": "volume_stream.pipelines.udf",
    "Pipeline": "volume_stream.pipelines.pipeline",
    "PipelineMetrics": "volume_stream.pipelines.options",
    "SqsNotification": "volume_stream.volumes.notifications",
    "SqlResult": "volume_stream.sql.result",
    "MnsNotification": "volume_stream.volumes.notifications",
    "Daemon": "volume_stream.daemon.daemon",
    "DaemonConfig": "volume_stream.config.daemon",
    "EventKind": "connectors.events",
    "ChangeLog": "volume_stream.shards.log",
    "ExportResult": "volume_stream.shards.export",
    "ShardApiServer": "volume_stream.serve.server",
    "AzureQueueNotification": "volume_stream.volumes.notifications",
}

__all__ = [
    "AlreadyExistsError",
    "AzureQueueNotification",
    "Batch",
    "Catalog",
    "ChangeLog",
    "ConfigError",
    "ConsumeConflictError",
    "Daemon",
    "DaemonConfig",
    "EventKind",
    "ExpiredIteratorError",
    "ExportResult",
    "FileEvent",
    "FileRecord",
    "InvalidInputError",
    "InventoryError",
    "LocalNotification",
    "MnsNotification",
    "NotFoundError",
    "Pipeline",
    "PipelineMetrics",
    "RefreshMetrics",
    "ShardApiServer",
    "SourceError",
    "SqlError",
    "SqlResult",
    "SqlSyntaxError",
    "SqsNotification",
    "StaleStreamError",
    "TrimmedDataError",
    "UnsupportedFeatureError",
    "VolumeStreamError",
    "WarehouseError",
    "__version__",
    "connect",
    "file_udf",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'volume_stream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
