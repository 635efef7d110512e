"""DataX job files for `volume-stream export --job job.json`, shaped like the OTSStream Reader's
template. Either form is read:

    {"configuration": {"reader": {"plugin": "otsstream", "parameter": {...}},
                       "writer": {"plugin": "...",
                                  "parameter": {"path": "...", "format": "parquet"}},
                       "setting": {"speed": {"concurrent": 4, "mbps": 10},
                                   "errorLimit": {"record": 0}}}}
    {"job": {"content": [{"reader": {"name": "otsstream", ...}, "writer": {...}}],
             "setting": {...}}}

Every key is read or refused (a key nothing reads is an error naming the known ones); the
template's `datasource` must be empty (the warehouse is the source) and `table` is another name
for `dataTable`. Reader parameters: `dataTable` (the volume or change-tracked table), `statusTable`, `startTimestampMillis` and
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


_READER_KEYS = {"dataTable", "table", "datasource", "statusTable", "startTimestampMillis",
                "endTimestampMillis", "date", "isExportSequenceInfo", "maxRetries",
                "safetyLagMillis"}
_WRITER_KEYS = {"path", "format", "fileType"}
_SETTING_KEYS = {"speed", "errorLimit"}
_SPEED_KEYS = {"concurrent", "channel", "mbps"}


def _check_keys(path: str | Path, sections: dict[str, tuple[dict[str, Any], set[str]]]) -> None:
    """Every key is honoured or refused: a key nobody reads (a typo, another writer plugin's
    setting) is named with the keys that are read."""
    for where, (section, known) in sections.items():
        if not isinstance(section, dict):
            raise InvalidInputError(f"job file {str(path)!r}: {where} must be an object, not "
                                    f"{section!r}")
        unknown = sorted(set(section) - known)
        if unknown:
            raise InvalidInputError(f"job file {str(path)!r}: {where} has key(s) nothing reads: "
                                    f"{', '.join(unknown)}; known: {', '.join(sorted(known))}")


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
    w = writer.get("parameter") or {}
    speed = setting.get("speed") or {}
    _check_keys(path, {"reader.parameter": (p, _READER_KEYS), "writer.parameter": (w, _WRITER_KEYS),
                       "setting": (setting, _SETTING_KEYS), "setting.speed": (speed, _SPEED_KEYS)})
    if str(p.get("datasource") or "").strip():
        raise InvalidInputError(f"job file {str(path)!r}: reader.parameter.datasource "
                                f"{p['datasource']!r} names a DataWorks data source; here the "
                                f"warehouse (--warehouse) is the source: leave it empty")
    volume = p.get("dataTable") or p.get("table")
    if p.get("table") and p.get("dataTable") and p["table"] != p["dataTable"]:
        raise InvalidInputError(f"job file {str(path)!r}: reader.parameter.table "
                                f"{p['table']!r} and dataTable {p['dataTable']!r} differ")
    if not volume:
        raise InvalidInputError(f"job file {str(path)!r}: reader.parameter.dataTable is missing")
    out = w.get("path")
    if not out:
        raise InvalidInputError(f"job file {str(path)!r}: writer.parameter.path is missing")
    fmt = str(w.get("format") or w.get("fileType") or "parquet").lower()
    if fmt not in _FORMATS:
        raise InvalidInputError(f"job file {str(path)!r}: writer format {fmt!r} is not one of "
                                f"{', '.join(_FORMATS)}")
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
