"""Volumes: where files live, how their events arrive, and which files count (DESIGN §2).

A volume's spec is stored in the catalog as JSON. Notifications are small frozen dataclasses;
secrets passed to them are used in this process only and never persisted (the stored spec keeps
the names of the keys, so a later process knows to take them from the environment).

Backends are looked up by the location's scheme; each gives a lister (for refresh), a reader
(for pipelines) and a listener (for watch). `file` is built in; `s3` and `oss` register here.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from connectors.base import Listener, Lister, ObjectReader
from volume_stream.errors import ConfigError, InvalidInputError

__all__ = [
    "BACKENDS",
    "Backend",
    "LocalNotification",
    "VolumeSpec",
    "normalize_location",
    "notification_from_dict",
]

SECRET_OPTION_KEYS = frozenset({
    "aws_secret_access_key", "aws_session_token", "access_key_secret", "security_token",
    "secret_access_key", "password", "token", "aws_access_key_id", "access_key_id",
})


@dataclass(frozen=True)
class LocalNotification:
    """Watch a local folder with inotify (watchdog); `polling=True` forces the stat-polling
    fallback (network file systems, containers without inotify)."""

    polling: bool = False
    debounce_s: float = 0.2
    poll_interval_s: float = 1.0
    type: str = field(default="LOCAL", init=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_NOTIFICATIONS: dict[str, type] = {"LOCAL": LocalNotification}


def register_notification(type_name: str, cls: type) -> None:
    _NOTIFICATIONS[type_name] = cls


def notification_types() -> dict[str, type]:
    """Every notification type by name, the cloud ones included (they register on first need)."""
    _load_cloud()
    return dict(_NOTIFICATIONS)


def notification_from_dict(data: dict[str, Any] | None):
    if not data:
        return None
    _load_cloud()
    data = dict(data)
    kind = data.pop("type")
    cls = _NOTIFICATIONS.get(kind)
    if cls is None:
        raise ConfigError(f"unknown notification type {kind!r}; known: {sorted(_NOTIFICATIONS)}")
    return cls(**data)


def _redact(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k not in SECRET_OPTION_KEYS}


def normalize_location(location: str | os.PathLike) -> str:
    """A canonical URL with a trailing '/': 'file:///abs/dir/', 's3://b/p/', 'oss://b/p/'."""
    text = os.fspath(location)
    parsed = urlparse(text)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
        path = Path(unquote(parsed.path) if parsed.scheme == "file" else text).expanduser()
        path = path.resolve()
        if not path.exists():
            raise InvalidInputError(f"location {text!r} does not exist")
        if not path.is_dir():
            raise InvalidInputError(f"location {text!r} is not a folder")
        if not os.access(path, os.R_OK | os.X_OK):
            raise InvalidInputError(f"location {text!r} is not readable")
        return f"file://{path.as_posix().rstrip('/')}/"
    _load_cloud()
    if parsed.scheme in BACKENDS:
        if not parsed.netloc:
            raise InvalidInputError(f"location {text!r} has no bucket")
        prefix = parsed.path.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return f"{parsed.scheme}://{parsed.netloc}/{prefix}"
    raise InvalidInputError(
        f"location {text!r}: unsupported scheme {parsed.scheme!r}; supported: a local path, "
        f"{', '.join(s + '://' for s in sorted(BACKENDS))}")


@dataclass(frozen=True)
class VolumeSpec:
    """Everything the catalog keeps about a volume."""

    name: str
    id: str
    location: str
    recursive: bool = True
    notification: dict[str, Any] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""

    @property
    def scheme(self) -> str:
        return urlparse(self.location).scheme

    @property
    def retention_days(self) -> float:
        return float(self.options.get("data_retention_days", 7))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["options"] = _redact(self.options)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VolumeSpec:
        return cls(**data)

    def accepts(self) -> Callable[[str], bool]:
        """A predicate on relative paths: recursion and include/exclude globs (§2)."""
        include = _globs(self.options.get("include"))
        exclude = _globs(self.options.get("exclude"))
        recursive = self.recursive

        def accept(path: str) -> bool:
            if path.endswith("/"):
                return False
            if not recursive and "/" in path:
                return False
            if include and not any(fnmatch.fnmatchcase(path, g) for g in include):
                return False
            return not any(fnmatch.fnmatchcase(path, g) for g in exclude)

        return accept


def _globs(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(value)


@dataclass(frozen=True)
class Backend:
    """How to list, read and listen to volumes of one URL scheme."""

    lister: Callable[[VolumeSpec], Lister]
    reader: Callable[[VolumeSpec], ObjectReader]
    listener: Callable[[VolumeSpec, Any], Listener]


def _local_path(spec: VolumeSpec) -> str:
    return unquote(urlparse(spec.location).path)


def _local_lister(spec: VolumeSpec) -> Lister:
    from connectors.local import LocalLister

    return LocalLister(_local_path(spec), recursive=spec.recursive)


def _local_reader(spec: VolumeSpec) -> ObjectReader:
    from connectors.local import LocalReader

    return LocalReader(_local_path(spec))


def _local_listener(spec: VolumeSpec, notification: Any) -> Listener:
    from connectors.local import LocalListener

    note = notification or LocalNotification()
    if not isinstance(note, LocalNotification):
        raise ConfigError(f"volume {spec.name!r} is local; its notification must be LOCAL, "
                          f"not {getattr(note, 'type', note)!r}")
    return LocalListener(_local_path(spec), recursive=spec.recursive, debounce_s=note.debounce_s,
                         polling=note.polling or None, poll_interval_s=note.poll_interval_s)


BACKENDS: dict[str, Backend] = {
    "file": Backend(_local_lister, _local_reader, _local_listener),
}


def register_backend(scheme: str, backend: Backend) -> None:
    BACKENDS[scheme] = backend


def backend_for(spec: VolumeSpec) -> Backend:
    _load_cloud()
    try:
        return BACKENDS[spec.scheme]
    except KeyError:
        raise ConfigError(f"volume {spec.name!r}: no backend for {spec.scheme}:// "
                          f"(known: {sorted(BACKENDS)})") from None


def _load_cloud() -> None:
    # s3:// and oss:// register themselves when volume_stream.cloud is imported; it builds on
    # this module, so it is loaded on first need rather than at import (no import cycle).
    import volume_stream.cloud  # noqa: F401


def __getattr__(name: str):
    if name in ("SqsNotification", "MnsNotification"):
        from volume_stream import cloud

        return getattr(cloud, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
