"""volume-stream: event-driven file streams on Apache Spark.

Queue listeners feed file events into a versioned directory table (Delta Lake with Change Data
Feed); streams turn its versions into INSERT / DELETE / UPDATE_BEFORE / UPDATE_AFTER records,
with offsets that move only when a consumer's output is committed.

    import volume_stream as vs
    cat = vs.connect("./warehouse")

Every name here loads its module on first use (the errors too: `volume_stream.errors` brings
pyarrow), so `import volume_stream` costs nothing and `volume-stream --version` starts no
more than Python.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "AlreadyExistsError": "volume_stream.errors",
    "ConfigError": "volume_stream.errors",
    "ConsumeConflictError": "volume_stream.errors",
    "ExpiredIteratorError": "volume_stream.errors",
    "InvalidInputError": "volume_stream.errors",
    "InventoryError": "volume_stream.errors",
    "NotFoundError": "volume_stream.errors",
    "SourceError": "volume_stream.errors",
    "SqlError": "volume_stream.errors",
    "SqlSyntaxError": "volume_stream.errors",
    "StaleStreamError": "volume_stream.errors",
    "TrimmedDataError": "volume_stream.errors",
    "UnsupportedFeatureError": "volume_stream.errors",
    "VolumeStreamError": "volume_stream.errors",
    "WarehouseError": "volume_stream.errors",
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
    "PubSubNotification": "volume_stream.volumes.notifications",
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
    "PubSubNotification",
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
