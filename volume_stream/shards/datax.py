"""DataX job files for `volume-stream export --job job.json`, shaped like the OTSStream Reader's
template. Either form is read:

    {"configuration": {"reader": {"plugin": "otsstream", "parameter": {...}},
                       "writer": {"plugin": "...",
                                  "parameter": {"path": "...", "format": "parquet"}},
                       "setting": {"speed": {"concurrent": 4, "mbps": 10},
                                   "errorLimit": {"record": 0}}}}
    {"job": {"content": [{"reader": {"name": "otsstream", ...}, "writer": {...}}],
             "setting": {...}}}

Reader parameters: `dataTable` (the volume or change-tracked table), `statusTable`, `startTimestampMillis` and
`endTimestampMillis` or `date` (yyyyMMdd), `isExportSequenceInfo`, `maxRetries`,
`safetyLagMillis` (how long ago the range must have ended; default 5000). Writer
parameters: `path` and `format` (or `fileType`: parquet, csv/text, delta). `speed.concurrent`
is the parallelism (shards exported at once), `speed.mbps` a bandwidth cap on written bytes.

`errorLimit` (DataX's tolerance of dirty records: records the writer could not write, which
DataX skips and counts until the limit fails the job) accepts only `record: 0` and
`percentage: 0`. No change record can be dirty here: every record comes from a typed schema
of scalar columns (a directory table's, or a SQL table's) and becomes text rows every writer
format (Parquet, CSV, Delta) holds, so nothing is ever skipped, and a write that fails fails the run (its windows are
retried and resumed, never dropped). A nonzero limit asks for skipping that cannot happen; it is
refused rather than silently meaning nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from volume_stream.errors import InvalidInputError

__all__ = ["job_options"]

_FORMATS = {"parquet": "parquet", "csv": "csv", "text": "csv", "delta": "delta"}


def _section(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    if "configuration" in doc:
        conf = doc["configuration"]
        return conf.get("reader") or {}, conf.get("writer") or {}, conf.get("setting") or {}
    if "job" in doc:
        content = doc["job"].get("content") or [{}]
        return (content[0].get("reader") or {}, content[0].get("writer") or {},
                doc["job"].get("setting") or {})
    raise InvalidInputError("job file has neither 'configuration' nor 'job'")


def _zero(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, str):
        value = value.strip()
        try:
            value = float(value)
        except ValueError:
            return False
    return isinstance(value, int | float) and value == 0


def _check_error_limit(limit: Any, path: str | Path) -> None:
    """Only 0 (see the module docstring: no record can be dirty, nothing is ever skipped)."""
    if limit is None:
        return
    if not isinstance(limit, dict):
        raise InvalidInputError(f"job file {str(path)!r}: setting.errorLimit must be an object "
                                f"like {{\"record\": 0}}, not {limit!r}")
    for name in ("record", "percentage"):
        if name in limit and not _zero(limit[name]):
            raise InvalidInputError(
                f"job file {str(path)!r}: errorLimit.{name} must be 0, not {limit[name]!r}: "
                f"this export has no dirty records to skip (every change record is written in "
                f"every format, and a failed write fails the run, to be resumed), so a "
                f"tolerance for them would never apply; set it to 0 or leave it out")
    unknown = set(limit) - {"record", "percentage"}
    if unknown:
        raise InvalidInputError(f"job file {str(path)!r}: unknown errorLimit setting(s) "
                                f"{', '.join(sorted(unknown))}; known: record, percentage")


def job_options(path: str | Path) -> tuple[str, dict[str, Any]]:
    """(volume, keyword arguments of `export_changes`) of a DataX job file."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"job file {str(path)!r} is unreadable or not JSON: {exc}"
                                ) from exc
    if not isinstance(doc, dict):
        raise InvalidInputError(f"job file {str(path)!r} is not a JSON object")
    reader, writer, setting = _section(doc)
    plugin = reader.get("plugin") or reader.get("name")
    if str(plugin).lower() not in ("otsstream", "otsstreamreader"):
        raise InvalidInputError(f"job file {str(path)!r}: reader plugin must be 'otsstream', "
                                f"not {plugin!r}")
    p = reader.get("parameter") or {}
    volume = p.get("dataTable")
    if not volume:
        raise InvalidInputError(f"job file {str(path)!r}: reader.parameter.dataTable is missing")
    w = writer.get("parameter") or {}
    out = w.get("path")
    if not out:
        raise InvalidInputError(f"job file {str(path)!r}: writer.parameter.path is missing")
    fmt = str(w.get("format") or w.get("fileType") or "parquet").lower()
    if fmt not in _FORMATS:
        raise InvalidInputError(f"job file {str(path)!r}: writer format {fmt!r} is not one of "
                                f"{', '.join(_FORMATS)}")
    speed = setting.get("speed") or {}
    _check_error_limit(setting.get("errorLimit"), path)
    options: dict[str, Any] = {
        "out": str((Path(path).parent / out) if not Path(out).is_absolute() else out),
        "format": _FORMATS[fmt],
        "status_table": p.get("statusTable"),
        "export_sequence_info": bool(p.get("isExportSequenceInfo", False)),
        "max_retries": int(p.get("maxRetries", 30)),
        "parallelism": int(speed.get("concurrent") or speed.get("channel") or 1),
        "mbps": float(speed["mbps"]) if speed.get("mbps") else None,
    }
    if p.get("safetyLagMillis") is not None:
        options["safety_lag_ms"] = int(p["safetyLagMillis"])
    if p.get("date"):
        options["date"] = str(p["date"])
    else:
        options["start_ms"] = p.get("startTimestampMillis")
        options["end_ms"] = p.get("endTimestampMillis")
    return str(volume), options
