"""Settings read from the environment (`VOLUME_STREAM_*`), in one place.

    Settings().warehouse        # VOLUME_STREAM_WAREHOUSE, default ./warehouse
"""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VOLUME_STREAM_", extra="ignore")

    warehouse: Path = Path("./warehouse")
    spark_master: str | None = None
    #: `sc://host:port` of a Spark Connect server (a daemon's warm Spark) for SQL
    spark_remote: str | None = None
    #: let Spark's own log lines through (the CLI's --verbose sets it)
    verbose: bool = False
