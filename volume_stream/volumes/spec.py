"""A volume's stored spec: where its files live and which of them count (DESIGN §2).

A volume's spec is stored in the catalog as JSON, without secrets: the options given to
`create_volume` that name credentials are kept in the creating process only, as
`connectors.secrets.Secret` (masked in repr/str, dropped from pickles).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlparse

from connectors.secrets import SECRET_KEYS, hide, is_secret

__all__ = ["SECRET_OPTION_KEYS", "VolumeSpec"]

#: option names that hold credentials (the one list: `connectors.secrets`)
SECRET_OPTION_KEYS = SECRET_KEYS


def redact(options: dict[str, Any]) -> dict[str, Any]:
    """`options` without the secret keys (what the catalog may store)."""
    return {k: v for k, v in options.items() if not is_secret(k)}


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", hide(self.options))

    @property
    def scheme(self) -> str:
        return urlparse(self.location).scheme

    @property
    def retention_days(self) -> float:
        return float(self.options.get("data_retention_days", 7))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["options"] = redact(self.options)
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


