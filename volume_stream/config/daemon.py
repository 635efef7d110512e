"""The daemon's configuration: a TOML file plus `VOLUME_STREAM_*` environment variables.

`DaemonConfig.load(path)` reads the file, resolves relative paths against the file's folder,
refuses secrets (credentials come only from the environment's standard variables or the cloud
credential chains, never from a file), then lets environment variables override any key: a
nested key is spelled with `__`, e.g. `VOLUME_STREAM_METRICS__PORT=9200` or
`VOLUME_STREAM_VOLUMES__LANDING__MAX_WAIT_S=1` (env names are case-insensitive, so a volume
overridden from the environment is matched by its lower-case name). A bad file raises
`ConfigError` naming the key, the file (or the variable) and what is allowed.

    warehouse = "/var/lib/volume-stream/warehouse"

    [metrics]
    port = 9108

    [volumes.landing]
    location = "/data/landing"          # created in the warehouse if missing
    target_commit_s = 5.0               # group commit: batches grow with the load, up to
    max_batch_bytes = 268435456         # about this commit time and this much memory
    refresh_interval_s = 3600

    [volumes.landing.streams]
    new_files = { mode = "APPEND_ONLY" }

    [pipelines.images]
    spec = "pipelines/images.toml"      # `volume-stream run SPEC` every interval_s, in the
    interval_s = 300                    # daemon's Spark session (isolate = true: a child process)

    [spark]
    connect_port = 15002                # serve Spark Connect: `volume-stream sql --remote`
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import tomllib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from connectors.secrets import is_secret
from volume_stream.config.settings import warehouse_location
from volume_stream.errors import ConfigError
from volume_stream.streams.changes import StreamMode
from volume_stream.volumes.backends import check_options
from volume_stream.volumes.batching import BatchLimits
from volume_stream.volumes.notifications import notification_from_dict, notification_types
from volume_stream.volumes.spec import VolumeSpec
from volume_stream.warehouse import STREAM, VOLUME, check_name

__all__ = [
    "DaemonConfig",
    "DaemonTuning",
    "MetricsConfig",
    "PipelineConfig",
    "SparkConfig",
    "StreamConfig",
    "VolumeConfig",
]

ENV_PREFIX = "VOLUME_STREAM_"

#: Keys that hold credentials: refused anywhere in the configuration (DESIGN §6).
_SECRET_HINT = ("credentials are read from the environment (AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY, ALIBABA_CLOUD_ACCESS_KEY_ID / "
                "ALIBABA_CLOUD_ACCESS_KEY_SECRET) or the cloud credential chains (instance "
                "roles, STS), never from the configuration")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MetricsConfig(_Section):
    """The HTTP endpoint serving `/metrics` (Prometheus), `/healthz` and `/readyz`."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(9108, ge=0, le=65535, description="0 picks a free port")
    #: serve the status page at `/` beside them (on a non-loopback host only with a token in
    #: VOLUME_STREAM_UI_TOKEN; the metrics and probes never need one)
    status_page: bool = True


class DaemonTuning(_Section):
    """How the daemon backs off, shuts down and reports."""

    shutdown_timeout_s: float = Field(30.0, gt=0)
    backoff_initial_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(30.0, gt=0)
    stats_interval_s: float = Field(15.0, gt=0)
    liveness_timeout_s: float = Field(600.0, gt=0)
    poison_after: int = Field(3, ge=1, description="failed attempts before isolating a batch")
    reopen_after: int = Field(3, ge=1, description="failures before the listener is reopened")
    dead_letter_dir: Path | str | None = Field(
        None, description="where poison events are written (default: <warehouse>/_dead_letter)")


class ShardApiConfig(_Section):
    """The DynamoDB Streams-compatible shard API (`volume-stream shard-api`) run by the daemon.
    With `require_signature`, requests must be SigV4-signed with the key in
    $VOLUME_STREAM_SHARD_API_ACCESS_KEY_ID / $VOLUME_STREAM_SHARD_API_SECRET (credentials
    never come from the file)."""

    enabled: bool = False
    listen: str = Field("127.0.0.1:8000", description="HOST:PORT (port 0 picks a free one)")
    require_signature: bool = False
    allow_anonymous: bool = Field(False, description="serve without a signature on a "
                                  "non-loopback listen address")
    region: str | None = Field(None, description="region of the stream ARNs and of the SigV4 "
                               "credential scope (default us-east-1)")
    account_id: str | None = Field(None, pattern=r"^\d{12}$")
    auto_split_s: float | None = Field(10.0, gt=0, description="auto-split check interval")


class StreamConfig(_Section):
    """A stream the daemon creates on its volume if it does not exist yet."""

    mode: StreamMode = "STANDARD"
    show_initial_rows: bool = False

    @field_validator("mode", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


def _parameters(cls: type) -> tuple[set[str], bool]:
    """The keyword arguments `cls` takes, and whether it takes any (`**options`)."""
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls) if f.init}, False
    params = inspect.signature(cls).parameters.values()
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named, any(p.kind is p.VAR_KEYWORD for p in params)


class VolumeConfig(_Section):
    """One volume the daemon listens to.

    `location`, `recursive`, `include`, `exclude`, `data_retention_days`, `notification` and
    `options` are used to create the volume when the warehouse does not have it; for an
    existing volume the location must match. The rest tunes the listener loop.
    """

    location: str | None = None
    recursive: bool = True
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    data_retention_days: float = Field(7.0, ge=0)
    deletion_vectors: bool | None = Field(None, description=(
        "merge-on-read directory table (DESIGN §4.8); default: on where the warehouse is a "
        "local disk or S3"))
    notification: dict[str, Any] | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    streams: dict[str, StreamConfig] = Field(default_factory=dict)
    enabled: bool = True
    max_batch_events: int | None = Field(None, ge=1, description=(
        "optional fixed cap on a batch; by default group commit sizes batches by "
        "target_commit_s and max_batch_bytes"))
    target_commit_s: float = Field(5.0, gt=0, description=(
        "group commit: a batch holds what commits in about this long, by the commit times "
        "measured so far (never fewer events than keep up with the load)"))
    max_batch_bytes: int = Field(256 << 20, ge=1 << 16, description=(
        "group commit: cap on the estimated memory of a batch's events"))
    max_wait_s: float = Field(0.5, ge=0, description=(
        "cap on how long a batch keeps growing after its first event; a batch is committed "
        "earlier, as soon as a receive finds the queue quiet"))
    poll_s: float = Field(1.0, gt=0, description="receive timeout while idle")
    refresh_on_start: bool = True
    inventory: str | None = Field(None, description=(
        "s3:// or oss:// URL of an inventory report's manifest.json or destination prefix: "
        "the start refresh reads the newest report instead of listing (DESIGN §4.4)"))
    refresh_interval_s: float | None = Field(3600.0, ge=0, description="0 or null: never")
    optimize_interval_s: float | None = Field(
        3600.0, ge=0, description="compact the directory table this often; 0 or null: never")

    def batch_limits(self) -> BatchLimits:
        """The caps group commit applies to this volume's batches."""
        return BatchLimits(max_batch_bytes=self.max_batch_bytes,
                           target_commit_s=self.target_commit_s, max_wait_s=self.max_wait_s,
                           max_events=self.max_batch_events)

    @field_validator("notification")
    @classmethod
    def _known_notification(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        _NOTIFICATIONS = notification_types()

        value = dict(value)
        kind = str(value.get("type", "")).upper()
        if kind not in _NOTIFICATIONS:
            raise ValueError(f"notification type {value.get('type')!r} is not known; "
                             f"allowed: {sorted(_NOTIFICATIONS)}")
        value["type"] = kind
        cls_ = _NOTIFICATIONS[kind]
        allowed, open_ended = _parameters(cls_)
        unknown = sorted(set(value) - allowed - {"type"})
        if unknown and not open_ended:
            raise ValueError(f"unknown notification key(s) {unknown} for type {kind}; "
                             f"allowed: {sorted(allowed)}")
        try:
            cls_(**{k: v for k, v in value.items() if k != "type"})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"notification of type {kind}: {exc}") from exc
        return value

    def notification_object(self) -> Any:
        """The notification dataclass (`LocalNotification`, `SqsNotification`...) or None."""
        return notification_from_dict(self.notification)


class SparkConfig(_Section):
    """The daemon's one Spark session (its pipelines share it) and its Spark Connect server.

    With `connect_port` set the daemon starts Spark at start-up, serving Spark Connect on
    `connect_host:connect_port`, so `volume-stream sql --remote sc://HOST:PORT` answers from a
    warm Spark; without it Spark starts when a pipeline first has files to process.
    """

    master: str | None = Field(None, description="default: spark_master, else local[*]")
    connect_port: int | None = Field(None, ge=1, le=65535)
    connect_host: str = "127.0.0.1"


class PipelineConfig(_Section):
    """A pipeline the daemon runs every `interval_s`.

    Either `spec` (run in the daemon's own Spark session, as `volume-stream run SPEC
    --warehouse WAREHOUSE` would; with `isolate = true` as that command, in a child process)
    or an explicit `command` (a list of arguments, always a child process) is required.
    """

    spec: Path | None = None
    command: list[str] | None = None
    isolate: bool = False
    interval_s: float = Field(300.0, gt=0)
    timeout_s: float | None = Field(None, gt=0)
    run_on_start: bool = True
    enabled: bool = True

    @model_validator(mode="after")
    def _spec_or_command(self) -> PipelineConfig:
        if (self.spec is None) == (self.command is None):
            raise ValueError("give exactly one of 'spec' (a pipeline spec file) or 'command' "
                             "(a list of arguments)")
        if self.command is not None and not self.command:
            raise ValueError("'command' must not be empty")
        return self


class DaemonConfig(BaseSettings):
    """Everything `volume-stream daemon` needs; `DaemonConfig.load(path)` builds one.

    Example:
        >>> cfg = DaemonConfig.load("volume-stream.toml")
        >>> cfg.volumes["landing"].max_wait_s
        0.5
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__",
                                      extra="forbid", frozen=True)

    #: a folder or a URI (`s3://bucket/prefix`, `hdfs://...`; DESIGN §3)
    warehouse: Path | str = Path("./warehouse")
    #: the warehouse's delta-rs storage options (`[storage_options]`: endpoint, region, ...;
    #: secrets are refused here, credentials come from the environment or a role)
    storage_options: dict[str, str] = Field(default_factory=dict)
    #: the Spark master of the pipelines the daemon runs (VOLUME_STREAM_SPARK_MASTER in their
    #: environment); None: theirs, else local[*]
    spark_master: str | None = None
    spark: SparkConfig = SparkConfig()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_json: bool = False
    metrics: MetricsConfig = MetricsConfig()
    daemon: DaemonTuning = DaemonTuning()
    shard_api: ShardApiConfig = ShardApiConfig()
    volumes: dict[str, VolumeConfig] = Field(default_factory=dict)
    pipelines: dict[str, PipelineConfig] = Field(default_factory=dict)
    #: the file this configuration was read from (not a key of the file)
    _source: Path | None = PrivateAttr(None)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's contents arrive as init arguments; the environment wins over them.
        return env_settings, init_settings

    @field_validator("warehouse", mode="before")
    @classmethod
    def _uri_or_path(cls, value: Any) -> Any:
        return warehouse_location(value)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _valid_names_and_options(self) -> DaemonConfig:
        # the same checks create_volume / create_stream make, so `config check` refuses what
        # the daemon would refuse at start
        for name, volume in self.volumes.items():
            check_name(VOLUME, name)
            for stream in volume.streams:
                check_name(STREAM, stream)
            location = volume.location or ""
            check_options(VolumeSpec(name=name, id="", location=location if "://" in location
                                     else "file:///", options=dict(volume.options)))
        return self

    @model_validator(mode="after")
    def _something_to_do(self) -> DaemonConfig:
        if not any(v.enabled for v in self.volumes.values()) and \
                not any(p.enabled for p in self.pipelines.values()) and \
                not self.shard_api.enabled:
            raise ValueError("nothing to run: configure at least one enabled [volumes.NAME] "
                             "or [pipelines.NAME] table")
        return self

    @property
    def dead_letter_dir(self) -> Path | str:
        if self.daemon.dead_letter_dir:
            return self.daemon.dead_letter_dir
        if isinstance(self.warehouse, str):  # an object-store warehouse
            return f"{self.warehouse.rstrip('/')}/_dead_letter"
        return self.warehouse / "_dead_letter"

    @classmethod
    def load(cls, path: str | os.PathLike) -> DaemonConfig:
        """Read `path` (TOML), apply `VOLUME_STREAM_*` overrides, validate.

        Raises:
            ConfigError: the file is missing or not TOML, holds a secret, or a key is unknown
                or has a bad value (the message names the key, the file and what is allowed).
        """
        file = Path(path).expanduser()
        try:
            text = file.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"config file {file} does not exist") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {file} is not UTF-8 text (byte {exc.start}: "
                              f"{exc.reason}); TOML files are UTF-8") from None
        except OSError as exc:
            raise ConfigError(f"config file {file} cannot be read: {exc}") from exc
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {file} is not valid TOML: {exc}") from exc
        _refuse_secrets(data, file)
        _resolve_paths(data, file.resolve().parent)
        return cls.from_mapping(data, source=file)

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, source: Path | None = None) -> DaemonConfig:
        """Validate an already parsed mapping (environment overrides still apply)."""
        _refuse_env_secrets()
        where = str(source) if source else "the configuration"
        try:
            config = cls(**data)
        except ValidationError as exc:
            raise ConfigError(_explain(exc, where)) from None
        config._source = source
        return config

    @property
    def source(self) -> Path | None:
        """The file this configuration was read from, if any."""
        return self._source

    def summary(self) -> dict[str, Any]:
        """A JSON-able view of the effective configuration (what `config check` prints)."""
        return self.model_dump(mode="json")


def _walk(data: Any, path: tuple[str, ...] = ()):
    if isinstance(data, dict):
        for key, value in data.items():
            yield path + (str(key),), value
            yield from _walk(value, path + (str(key),))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _walk(value, path + (str(i),))


def _refuse_secrets(data: dict[str, Any], file: Path) -> None:
    for path, _value in _walk(data):
        if is_secret(path[-1]):
            raise ConfigError(f"config file {file}: key {'.'.join(path)!r} is a secret; "
                              f"remove it: {_SECRET_HINT}")


def _refuse_env_secrets() -> None:
    for name in os.environ:
        upper = name.upper()
        if upper.startswith(ENV_PREFIX) and "__" in upper:
            last = upper.rsplit("__", 1)[1].lower()
            if is_secret(last):
                raise ConfigError(f"environment variable {name} sets a secret as a "
                                  f"configuration key; unset it: {_SECRET_HINT}")


def _is_url(text: str) -> bool:
    return len(urlparse(text).scheme) > 1


def _resolve(value: Any, base: Path) -> Any:
    if not isinstance(value, str) or not value or _is_url(value):
        return value
    path = Path(value).expanduser()
    return os.path.normpath(path if path.is_absolute() else base / path)


def _resolve_paths(data: dict[str, Any], base: Path) -> None:
    """Relative paths in a file are relative to the file's folder, not to the current one."""
    if "warehouse" in data:
        data["warehouse"] = _resolve(data["warehouse"], base)
    daemon = data.get("daemon")
    if isinstance(daemon, dict) and "dead_letter_dir" in daemon:
        daemon["dead_letter_dir"] = _resolve(daemon["dead_letter_dir"], base)
    for volume in (data.get("volumes") or {}).values():
        if isinstance(volume, dict) and "location" in volume:
            volume["location"] = _resolve(volume["location"], base)
    for pipeline in (data.get("pipelines") or {}).values():
        if isinstance(pipeline, dict) and "spec" in pipeline:
            pipeline["spec"] = _resolve(pipeline["spec"], base)


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """The keys allowed in the table holding `loc`'s last key."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        else:  # dict[str, Model]: the part is the entry's name
            args = getattr(current, "__args__", ())
            current = args[-1] if args else None
        if current is None:
            return None
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return None


def _env_name(loc: tuple[Any, ...]) -> str | None:
    wanted = (ENV_PREFIX + "__".join(str(p) for p in loc)).upper()
    return next((name for name in os.environ if name.upper() == wanted), None)


def _explain(exc: ValidationError, where: str) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        env = _env_name(loc) if loc else None
        origin = f"environment variable {env}" if env else where
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(DaemonConfig, loc)
            shown = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
            lines.append(f"{origin}: unknown key {key!r}{shown}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
            lines.append(f"{origin}: key {key!r}: {msg}{shown}")
    return "invalid configuration:\n  " + "\n  ".join(lines)
