"""Settings read from the environment (`VOLUME_STREAM_*`), in one place.

    Settings().warehouse        # VOLUME_STREAM_WAREHOUSE, default ./warehouse
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from connectors.secrets import hide
from volume_stream.errors import ConfigError

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


_EXAMPLES = {"storage_options": '{"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "..."}'}


def _explain(exc: Exception) -> str:
    """One line naming the environment variable and what it must hold."""
    if isinstance(exc, ValidationError):
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "?"
            key = f" key {error['loc'][1]!r}" if len(error["loc"]) > 1 else ""
            example = f" (e.g. {_EXAMPLES[field]})" if field in _EXAMPLES else ""
            message = error["msg"][:1].lower() + error["msg"][1:]
            problems.append(f"VOLUME_STREAM_{field.upper()}{key}: {message}{example}")
        return "invalid environment: " + "; ".join(problems)
    text = str(exc)
    for field, example in _EXAMPLES.items():
        if f'"{field}"' in text:
            return (f"invalid environment: VOLUME_STREAM_{field.upper()} is not valid JSON; "
                    f"write a JSON object of strings, e.g. {example}")
    return f"invalid environment: {text}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VOLUME_STREAM_", extra="ignore")

    #: a folder, or a URI (`s3://bucket/prefix`, `hdfs://...`): `warehouse_location` keeps it
    warehouse: Path | str = Path("./warehouse")
    #: delta-rs storage options of the warehouse, as JSON (VOLUME_STREAM_STORAGE_OPTIONS);
    #: credentials belong in the standard AWS_* environment or a role; any given here anyway
    #: are held as `connectors.secrets.Secret` (masked in repr, never pickled)
    storage_options: dict[str, Any] = {}
    #: the status page's token (VOLUME_STREAM_UI_TOKEN): `ui --token` and the daemon's page
    ui_token: SecretStr | None = None

    @field_validator("storage_options")
    @classmethod
    def _hide_secrets(cls, value: dict[str, Any]) -> dict[str, Any]:
        return hide({str(k): str(v) if not isinstance(v, SecretStr) else v
                     for k, v in value.items()})

    def __init__(self, **values: Any):
        """Read the environment; a malformed value is a ConfigError naming the variable."""
        try:
            super().__init__(**values)
        except (ValidationError, SettingsError) as exc:
            raise ConfigError(_explain(exc)) from exc

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
