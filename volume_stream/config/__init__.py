"""Configuration: process settings from the environment, and the daemon's TOML file (DESIGN §9).

    settings  Settings (VOLUME_STREAM_WAREHOUSE, VOLUME_STREAM_SPARK_MASTER)
    daemon    DaemonConfig and its sections (volumes, streams, pipelines, metrics, tuning)
"""

from volume_stream.config.daemon import (
    DaemonConfig,
    DaemonTuning,
    MetricsConfig,
    PipelineConfig,
    StreamConfig,
    VolumeConfig,
)
from volume_stream.config.settings import Settings

__all__ = ["DaemonConfig", "DaemonTuning", "MetricsConfig", "PipelineConfig", "Settings",
           "StreamConfig", "VolumeConfig"]
