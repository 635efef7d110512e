"""Configuration: process settings from the environment, and the daemon's TOML file (DESIGN §9).

    settings  Settings (VOLUME_STREAM_WAREHOUSE, VOLUME_STREAM_SPARK_MASTER, ..._SPARK_REMOTE)
    daemon    DaemonConfig and its sections (volumes, streams, pipelines, spark, metrics, tuning)

The daemon's models load on first use, so a command that only needs `Settings` starts faster.
"""

from __future__ import annotations

import importlib
from typing import Any

from volume_stream.config.settings import Settings

__all__ = ["DaemonConfig", "DaemonTuning", "MetricsConfig", "PipelineConfig", "Settings",
           "SparkConfig", "StreamConfig", "VolumeConfig"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("volume_stream.config.daemon"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
