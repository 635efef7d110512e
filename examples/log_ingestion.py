"""Recipe: log files into typed rows, one row per line, as a per-file UDF pipeline.

Understands JSON lines (`ts`/`time`/`timestamp`/`@timestamp`, `level`/`severity`,
`msg`/`message`; the other keys are kept as JSON in `attributes`) and Apache/Nginx access logs
in the combined or common format (client IP, user, time, method, path, protocol, status, bytes,
referer, user agent). A line that is neither is kept too, as `format = 'unparsed'` with the raw
text and the reason in `parse_error`, so nothing is silently lost and one garbled line does not
fail its file. Files are streamed line by line; `*.gz` files are decompressed on the fly.

    python examples/log_ingestion.py                      # self-contained: sample logs
    python examples/log_ingestion.py --warehouse W --volume landing [--target log_lines]
    volume-stream run examples/pipelines/log_ingestion.toml
"""

from __future__ import annotations

import argparse
import atexit
import gzip
import io
import json
import re
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import volume_stream as vs

SCHEMA = ("line_no long, format string, ts timestamp, level string, message string, "
          "client_ip string, user string, method string, path string, protocol string, "
          "status int, bytes long, referer string, user_agent string, attributes string, "
          "raw string, parse_error string")
LOG_GLOBS = ["*.log", "*.log.gz", "*.jsonl", "*.jsonl.gz", "*.ndjson", "*access.log*"]
_ACCESS = re.compile(
    r'^(?P<client_ip>\S+) \S+ (?P<user>\S+) \[(?P<time>[^\]]+)\] '
    r'"(?P<method>[A-Z]+) (?P<path>\S+)(?: (?P<protocol>[^"]*))?" '
    r'(?P<status>\d{3}) (?P<bytes>\d+|-)'
    r'(?: "(?P<referer>(?:[^"\\]|\\.)*)" "(?P<user_agent>(?:[^"\\]|\\.)*)")?\s*$')
_MONTHS = {m: i for i, m in enumerate(
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"], 1)}
_TS_KEYS = ("ts", "time", "timestamp", "@timestamp")
_LEVEL_KEYS = ("level", "severity", "lvl")
_MESSAGE_KEYS = ("msg", "message")


def _access_time(text: str) -> datetime:
    # '10/Oct/2000:13:55:36 -0700', parsed by hand: %b depends on the locale
    day, month, rest = text.split("/", 2)
    parsed = datetime.strptime(f"{rest[:4]}-{_MONTHS[month]:02d}-{day} {rest[5:]}",
                               "%Y-%m-%d %H:%M:%S %z")
    return parsed.astimezone(UTC)


def _json_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = value / 1000 if value > 1e11 else value  # epoch millis or seconds
        return datetime.fromtimestamp(seconds, UTC)
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC)


def _first(obj: dict, keys: tuple[str, ...]) -> Any:
    for key in keys:
        if key in obj:
            return obj.pop(key)
    return None


def parse_line(line: str) -> dict[str, Any]:
    """One log line as a row (without `line_no`); never raises.

    Example:
        >>> parse_line('{"ts": "2024-01-01T00:00:00Z", "level": "info", "msg": "up"}')["level"]
        'info'
    """
    text = line.rstrip("\r\n")
    stripped = text.strip()
    try:
        if stripped.startswith("{"):
            obj = json.loads(stripped)
            if not isinstance(obj, dict):
                raise ValueError("JSON line is not an object")
            ts = _json_time(_first(obj, _TS_KEYS))
            level, message = _first(obj, _LEVEL_KEYS), _first(obj, _MESSAGE_KEYS)
            return {"format": "json", "ts": ts,
                    "level": None if level is None else str(level),
                    "message": None if message is None else str(message),
                    "attributes": json.dumps(obj, ensure_ascii=False) if obj else None}
        m = _ACCESS.match(text)
        if m:
            fields = m.groupdict()
            combined = fields["user_agent"] is not None
            return {"format": "combined" if combined else "common",
                    "ts": _access_time(fields["time"]), "client_ip": fields["client_ip"],
                    "user": None if fields["user"] == "-" else fields["user"],
                    "method": fields["method"], "path": fields["path"],
                    "protocol": fields["protocol"], "status": int(fields["status"]),
                    "bytes": None if fields["bytes"] == "-" else int(fields["bytes"]),
                    "referer": None if fields["referer"] in (None, "-") else fields["referer"],
                    "user_agent": fields["user_agent"]}
        raise ValueError("neither a JSON object nor a common/combined access log line")
    except (ValueError, KeyError, IndexError, OverflowError) as exc:
        return {"format": "unparsed", "raw": text, "parse_error": str(exc)[:500]}


@vs.file_udf(SCHEMA)
def log_lines(file: vs.FileRecord):
    """One row per non-blank line of a log file."""
    with file.open() as raw:
        stream = gzip.GzipFile(fileobj=raw) if file.relative_path.endswith(".gz") else raw
        text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")
        for line_no, line in enumerate(text, 1):
            if line.strip():
                yield {"line_no": line_no, **parse_line(line)}


def make_samples(folder: Path) -> None:
    """An access log, a JSON-lines app log, and a gzipped log, each with a garbled line."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nginx-access.log").write_text(
        '203.0.113.7 - - [10/Oct/2024:13:55:36 +0200] "GET /index.html HTTP/1.1" 200 2326 '
        '"https://example.com/" "Mozilla/5.0 (X11; Linux x86_64)"\n'
        '198.51.100.2 - alice [10/Oct/2024:13:55:37 +0000] "POST /api/login HTTP/2.0" 401 -\n'
        '\x00\x17garbled <<< not a log line\n')
    (folder / "app.jsonl").write_text(
        '{"ts": "2024-10-10T11:55:36Z", "level": "INFO", "msg": "started", "port": 8080}\n'
        '{"time": 1728561337000, "severity": "error", "message": "db down", "retry": 3}\n'
        '{"ts": "2024-10-10T11:55:38Z", "level": "INFO", "msg": "trunc\n')
    with gzip.open(folder / "old.log.gz", "wt") as f:
        f.write('{"ts": "2024-10-09T00:00:00Z", "level": "WARN", "msg": "disk 91%"}\n')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warehouse", type=Path, help="an existing warehouse")
    parser.add_argument("--volume", help="the volume to read (with --warehouse)")
    parser.add_argument("--stream", default="log_files")
    parser.add_argument("--keep", action="store_true",
                        help="keep the sample folder and warehouse (default: removed at exit)")
    parser.add_argument("--target", default="log_lines")
    args = parser.parse_args()
    if (args.warehouse is None) != (args.volume is None):
        parser.error("--warehouse and --volume go together")
    if args.warehouse is None:
        work = Path(tempfile.mkdtemp(prefix="vs-log-ingestion-"))
        if not args.keep:  # a recipe's samples are not worth a folder left in /tmp
            atexit.register(shutil.rmtree, work, True)
        make_samples(work / "logs")
        cat = vs.connect(work / "warehouse")
        cat.create_volume("logs", work / "logs")
        args.volume = "logs"
        print(f"sample logs in {work / 'logs'}, warehouse {work / 'warehouse'}"
              f"{'' if args.keep else ' (removed at exit; --keep keeps them)'}")
    else:
        cat = vs.connect(args.warehouse)
    if args.stream not in {s["name"] for s in cat.list_streams()}:
        cat.create_stream(args.stream, on_volume=args.volume, show_initial_rows=True)
    cat.refresh(args.volume)  # pick up files added since (a running `watch` does this too)
    pipeline = cat.pipeline(args.stream, log_lines, args.target, path_glob=LOG_GLOBS)
    print(pipeline.run_once().as_dict())
    from deltalake import DeltaTable

    table = DeltaTable(pipeline.target_uri).to_pyarrow_table(columns=[
        "relative_path", "line_no", "format", "ts", "level", "message", "client_ip", "status",
        "bytes", "parse_error"])
    print(pipeline.target_uri)
    cat.spark.createDataFrame(table).orderBy("relative_path", "line_no").show(truncate=40)


if __name__ == "__main__":
    main()
