"""A pipeline's validated options and the metrics of one run (DESIGN §7)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from volume_stream.errors import InvalidInputError

__all__ = ["CHANGE_TYPES", "FORMATS", "META_COLUMNS", "ON_DELETE", "PipelineMetrics",
           "PipelineOptions"]

CHANGE_TYPES = ("INSERT", "UPDATE_AFTER", "UPDATE_BEFORE", "DELETE")
ON_DELETE = ("ignore", "delete_rows")
#: how the target is written: None, the executors' files committed by volume-stream
#: (`pipelines.sink`); "delta", by Spark's Delta connector (`pipelines.delta_target`)
FORMATS = (None, "delta")
#: Columns every result row gets beside the UDF's own.
META_COLUMNS = ("relative_path", "__change_type", "__commit_version", "processed_at")


@dataclass(frozen=True)
class PipelineMetrics:
    """What one `run_once` did. `start_version`/`end_version` bound the consumed range
    (start, end]; `resumed_files` counts files an earlier, interrupted run had already
    committed (skipped, not written again)."""

    stream: str
    target: str
    batch_id: int | None
    start_version: int
    end_version: int
    files_seen: int = 0
    files_ok: int = 0
    files_failed: int = 0
    rows_written: int = 0
    rows_deleted: int = 0
    paths_deleted: int = 0
    resumed_files: int = 0
    commits: int = 0
    seconds: float = 0.0

    @property
    def versions(self) -> tuple[int, int]:
        return (self.start_version, self.end_version)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PipelineOptions:
    """Validated options of a pipeline (see `Catalog.pipeline`)."""

    change_types: tuple[str, ...] = ("INSERT", "UPDATE_AFTER")
    path_glob: tuple[str, ...] = ()
    on_delete: str = "ignore"
    max_files_per_batch: int | None = None
    parallelism: int | None = None
    max_attempts: int = 3
    retry_backoff_s: float = 0.5
    progress: bool | None = None
    format: str | None = None

    @classmethod
    def of(cls, change_types: Iterable[str] = ("INSERT", "UPDATE_AFTER"),
           path_glob: str | Iterable[str] | None = None, on_delete: str = "ignore",
           max_files_per_batch: int | None = None, parallelism: int | None = None,
           max_attempts: int = 3, retry_backoff_s: float = 0.5,
           progress: bool | None = None, format: str | None = None) -> PipelineOptions:
        if isinstance(change_types, str):
            change_types = [change_types]
        types = tuple(str(t).upper() for t in change_types)
        bad = [t for t in types if t not in CHANGE_TYPES]
        if bad or not types:
            raise InvalidInputError(f"invalid change_types {list(change_types)!r}; choose from "
                                    f"{', '.join(CHANGE_TYPES)}")
        globs = (path_glob,) if isinstance(path_glob, str) else tuple(path_glob or ())
        if on_delete not in ON_DELETE:
            raise InvalidInputError(f"invalid on_delete {on_delete!r}; choose from "
                                    f"{', '.join(ON_DELETE)}")
        for name, value in (("max_files_per_batch", max_files_per_batch),
                            ("parallelism", parallelism)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise InvalidInputError(f"{name} must be a positive integer, not {value!r}")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidInputError(f"max_attempts must be >= 1, not {max_attempts!r}")
        if retry_backoff_s < 0:
            raise InvalidInputError(f"retry_backoff_s must be >= 0, not {retry_backoff_s!r}")
        if format not in FORMATS:
            raise InvalidInputError(f"invalid format {format!r}; choose 'delta' (written by "
                                    f"Spark's Delta connector) or leave it out")
        if format == "delta" and (on_delete != "ignore" or max_files_per_batch is not None):
            raise InvalidInputError(
                "format 'delta' writes each batch in one Spark commit per table: "
                "on_delete='delete_rows' and max_files_per_batch are the default target's")
        return cls(types, globs, on_delete, max_files_per_batch, parallelism, max_attempts,
                   float(retry_backoff_s), progress, format)
