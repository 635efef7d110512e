"""Settings read from the environment (`VOLUME_STREAM_*`), in one place.

    Settings().warehouse        # VOLUME_STREAM_WAREHOUSE, default ./warehouse
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "warehouse_location"]


def warehouse_location(value: Any) -> Any:
    """A warehouse given as text: a URI other than file:// stays a string (`Path` would
    collapse `s3://b/p` into `s3:/b/p`), anything else becomes a `Path`."""
    if isinstance(value, str) and len(urlparse(value).scheme) > 1 \
            and urlparse(value).scheme != "file":
        return value
    if isinstance(value, str | os.PathLike):
        return Path(value)
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VOLUME_STREAM_", extra="ignore")

    #: a folder, or a URI (`s3://bucket/prefix`, `hdfs://...`): `warehouse_location` keeps it
    warehouse: Path | str = Path("./warehouse")
    #: delta-rs storage options of the warehouse, as JSON (VOLUME_STREAM_STORAGE_OPTIONS);
    #: no secrets: credentials come from the standard AWS_* environment or a role
    storage_options: dict[str, str] = {}

    @field_validator("warehouse", mode="before")
    @classmethod
    def _uri_or_path(cls, value: Any) -> Any:
        return warehouse_location(value)
    spark_master: str | None = None
    #: `sc://host:port` of a Spark Connect server (a daemon's warm Spark) for SQL
    spark_remote: str | None = None
    #: seconds to wait for the Spark Connect server before giving up (sql --connect-timeout)
    connect_timeout: float = 10
    #: let Spark's own log lines through (the CLI's --verbose sets it)
    verbose: bool = False
