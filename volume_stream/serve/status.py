"""The facts of a warehouse at a glance, gathered in one place (DESIGN §8.3).

`StatusSource(catalog).status()` is what the status page (`/`), its JSON twin
(`/status.json`) and `volume-stream status [--json]` show: every volume (location, files,
bytes, latest version and commit time, and under a daemon its listener's state), every stream
(offset, latest version, pending changes, stale or not, how long the oldest pending commit has
waited), the daemon's pipelines, and the change logs (shards). `file_history` is every change
record of one file, oldest first. Everything here only reads.

    source = StatusSource(connect("./warehouse"))
    facts = source.status()          # plain JSON-able dicts and lists
    source.file_history("landing", "a/b.csv")

Reading a stream's pending changes costs O(changes), never O(files); a volume's byte count
reads one column of its latest version and is kept per (table, version), so a page polled every
two seconds reads it again only after a commit. A fact that cannot be read (a volume whose table
is gone, a stream whose volume was replaced) becomes an `error` entry beside the others, never a
failed page.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pyarrow.compute as pc

from volume_stream.errors import InvalidInputError, VolumeStreamError, converted
from volume_stream.serve.charts import Timeline, charts
from volume_stream.serve.file_history import file_history

__all__ = ["StatusSource", "Live"]

#: What a daemon knows that the warehouse does not: {"volumes": {name: runner status},
#: "pipelines": {name: runner status}} (see `Daemon.live_status`).
Live = Callable[[], dict[str, Any]]

_HISTORY = 200  # commits read per volume to date a stream's oldest pending change
_CHANGE_LOG = "change_log"  # volume_stream.shards.meta.CHANGE_LOG (a feature: not imported)


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        value = value if value.tzinfo else value.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat(timespec="seconds")
    return str(value)


def _plain(value: Any) -> Any:
    """A value JSON can hold (datetimes as ISO 8601 text)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return _iso(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _error(exc: Exception) -> str:
    if isinstance(exc, VolumeStreamError):
        return exc.message("cli")
    return f"{type(exc).__name__}: {exc}"


class StatusSource:
    """Gathers the warehouse's facts for the page, its JSON twin and `status`.

    Args:
        catalog: The warehouse's `Catalog`.
        live: What a daemon adds (listener and pipeline states); None without a daemon.
        clock: Now, as an aware UTC datetime (tests and `staleness_s`).
        timeline: The daemon's samples of its counters and pending changes (charts); None:
            a timeline of this source's own, holding the pending changes of each `status()`.

    Example:
        >>> facts = StatusSource(connect("./warehouse")).status()
        >>> [v["name"] for v in facts["volumes"]]
        ['landing']
    """

    def __init__(self, catalog: Any, live: Live | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 timeline: Timeline | None = None) -> None:
        self.catalog = catalog
        self.live = live
        self.clock = clock
        self._own_timeline = timeline is None
        self.timeline = Timeline() if timeline is None else timeline
        self._lock = threading.Lock()
        self._bytes: dict[tuple[str, int], int] = {}
        self._history: dict[tuple[str, int], list[dict[str, Any]]] = {}

    # ------------------------------------------------------------------ the whole picture
    def status(self) -> dict[str, Any]:
        """Every volume, stream, pipeline and change log, as plain JSON-able values."""
        now = self.clock()
        live = self._live()
        histories: list[tuple[list[datetime], bool]] = []
        volumes = self.volumes(live, histories)
        facts = {
            "generated_at": _iso(now),
            "warehouse": str(self.catalog.warehouse.uri),
            "daemon": self.live is not None,
            "volumes": volumes,
            "streams": self.streams(now),
            "pipelines": self.pipelines(live),
            "change_logs": self.change_logs(),
        }
        facts["summary"] = {
            "volumes": len(volumes),
            "files": sum(v.get("files") or 0 for v in volumes),
            "bytes": sum(v.get("bytes") or 0 for v in volumes),
            "streams": len(facts["streams"]),
            "pending_changes": sum(s.get("pending_changes") or 0 for s in facts["streams"]),
            "stale_streams": sum(1 for s in facts["streams"] if s.get("stale")),
            "errors": sum(1 for part in ("volumes", "streams", "pipelines")
                          for row in facts[part] if row.get("error")),
        }
        if self._own_timeline:
            self.timeline.record({"pending": facts["summary"]["pending_changes"]},
                                 at=now.timestamp())
        facts["charts"] = charts(histories, self.timeline, now=now.timestamp())
        return _plain(facts)

    def _live(self) -> dict[str, Any]:
        if self.live is None:
            return {}
        try:
            return self.live() or {}
        except Exception as exc:  # a daemon shutting down: show the warehouse anyway
            return {"error": _error(exc)}

    # ------------------------------------------------------------------ volumes
    def volumes(self, live: dict[str, Any] | None = None,
                histories: list[tuple[list[datetime], bool]] | None = None
                ) -> list[dict[str, Any]]:
        """One row per volume; under a daemon with its listener's state. `histories` gets
        each volume's commit times read (and whether they are all of them) for the charts."""
        runners = (live or {}).get("volumes", {})
        rows = []
        for info in self.catalog.list_volumes():
            row = {k: info.get(k) for k in ("name", "location", "notification", "recursive",
                                           "version", "files")}
            try:
                table = self.catalog.directory_table(info["name"])
                row["bytes"] = self._volume_bytes(table, info["version"])
                commits = self._commits(table, info["version"])
                last = commits[:1]
                if histories is not None:
                    histories.append(([c["timestamp"] for c in commits],
                                      len(commits) < _HISTORY))
                row["last_commit"] = _iso(last[0]["timestamp"]) if last else None
                row["last_operation"] = last[0]["operation"] if last else None
            except Exception as exc:
                row["error"] = _error(exc)
            runner = runners.get(info["name"])
            row["listener"] = None if runner is None else {
                "state": _listener_state(runner), **runner}
            rows.append(row)
        return rows

    def volume(self, name: str, commits: int = 20) -> dict[str, Any]:
        """One volume: its description, listener and latest `commits` commits, newest first."""
        info = self.catalog.describe_volume(name)
        runner = self._live().get("volumes", {}).get(name)
        table = self.catalog.directory_table(name)
        with converted(f"volume {name!r}"):
            info["bytes"] = self._volume_bytes(table, info["version"])
            history = self._commits(table, info["version"])[:commits]
        info["listener"] = None if runner is None else {"state": _listener_state(runner),
                                                        **runner}
        info["history"] = [{"version": h["version"], "timestamp": _iso(h["timestamp"]),
                            "operation": h["operation"], "metrics": h.get("metrics") or {}}
                           for h in history]
        info["streams"] = [s["name"] for s in self.catalog.list_streams()
                           if s.get("volume") == name]
        return _plain(info)

    def _volume_bytes(self, table: Any, version: int) -> int:
        key = (str(table.path), version)
        with self._lock:
            if key in self._bytes:
                return self._bytes[key]
        sizes = table.snapshot(version, columns=["size"])["size"]
        total = int(pc.sum(sizes).as_py() or 0)
        with self._lock:
            self._bytes = {k: v for k, v in self._bytes.items() if k[0] != key[0]}
            self._bytes[key] = total
        return total

    def _commits(self, table: Any, version: int) -> list[dict[str, Any]]:
        """The table's latest commits, newest first, kept until the next version."""
        key = (str(table.path), version)
        with self._lock:
            if key in self._history:
                return self._history[key]
        history = table.history(_HISTORY)
        with self._lock:
            self._history = {k: v for k, v in self._history.items() if k[0] != key[0]}
            self._history[key] = history
        return history

    # ------------------------------------------------------------------ streams
    def streams(self, now: datetime | None = None) -> list[dict[str, Any]]:
        """One row per stream (on a volume or a table): offset, latest version, pending
        changes, stale, and how long its oldest pending commit has waited."""
        now = now or self.clock()
        rows = []
        for stream in self.catalog.list_streams():
            on_table = stream.get("table") is not None
            row: dict[str, Any] = {
                "name": stream["name"], "on": "table" if on_table else "volume",
                "source": stream.get("table") if on_table else stream.get("volume"),
                "mode": stream.get("mode"), "offset": stream.get("offset"),
                "batch_id": stream.get("batch_id")}
            try:
                info = self.catalog.describe_stream(stream["name"])
            except Exception as exc:
                rows.append({**row, "error": _error(exc)})
                continue
            row.update(latest_version=info.get("latest_version"),
                       oldest_version=info.get("oldest_version"),
                       pending_changes=info.get("pending_changes"),
                       stale=bool(info.get("stale")), pinned_end=info.get("pinned_end"))
            behind = (row["latest_version"] or 0) - (row["offset"] or 0)
            row["versions_behind"] = max(behind, 0)
            row["waiting_since"] = None
            if not on_table and behind > 0:
                row["waiting_since"] = self._first_pending(row["source"], row["offset"])
            since = row["waiting_since"]
            row["staleness_s"] = (None if since is None else round(
                (now - datetime.fromisoformat(since)).total_seconds(), 1))
            rows.append(row)
        return rows

    def _first_pending(self, volume: str, offset: int) -> str | None:
        """The commit time of the first version after `offset` (or, past the commits kept
        for dating, of the oldest one read: a lower bound)."""
        try:
            table = self.catalog.directory_table(volume)
            commits = self._commits(table, table.version())
        except Exception:
            return None
        later = [c for c in commits if c["version"] > offset]
        return _iso(later[-1]["timestamp"]) if later else None

    def stream(self, name: str, limit: int = 50) -> dict[str, Any]:
        """One stream: its row of `streams()` and its first `limit` pending change records."""
        row = next((s for s in self.streams() if s["name"] == name), None)
        if row is None:
            self.catalog.describe_stream(name)  # the NotFoundError naming what exists
            raise InvalidInputError(f"stream {name!r} vanished while it was read")
        records: list[dict[str, Any]] = []
        if not row.get("error") and not row.get("stale"):
            table = self.catalog.read_stream_arrow(name)
            records = table.slice(0, limit).to_pylist()
        return _plain({**row, "records": records, "records_shown": len(records)})

    # ------------------------------------------------------------------ pipelines, logs
    @staticmethod
    def pipelines(live: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The daemon's pipelines: runs, last outcome (none without a daemon)."""
        rows = []
        for name, state in sorted((live or {}).get("pipelines", {}).items()):
            failing = state.get("last_outcome") not in (None, "ok")
            rows.append({"name": name, **state,
                         "error": f"last run {state.get('last_outcome')}" if failing else None})
        return rows

    def change_logs(self) -> list[dict[str, Any]]:
        """The change logs (shards) of volumes and tables, from the catalog alone."""
        rows = []
        for (kind, name), meta in sorted(self.catalog.warehouse.read().items()):
            if kind != _CHANGE_LOG or not meta.get("streams"):
                continue
            current = meta["streams"][-1]
            shards = current.get("shards", [])
            rows.append({
                "volume": name, "label": current.get("label"),
                "view_type": current.get("view_type"),
                "enabled": current.get("disabled_version") is None,
                "open_shards": sum(1 for s in shards if s.get("end_version") is None),
                "shards": len(shards), "labels": len(meta["streams"]),
                "start_version": current.get("start_version")})
        return rows

    # ------------------------------------------------------------------ one file
    def file_history(self, volume: str, path: str) -> dict[str, Any]:
        """Every change of `path` in the volume's kept versions, oldest first, its row at each
        of those versions (time travel), the stream records they made, and its row at the
        latest version (None once deleted): `serve.file_history`.

        Raises:
            NotFoundError: no such volume.
            InvalidInputError: an empty path.
        """
        table = self.catalog.directory_table(volume)
        with converted(f"volume {volume!r}"):
            times = {c["version"]: _iso(c["timestamp"])
                     for c in self._commits(table, table.version())}
        return _plain(file_history(table, volume, path, times))


def _listener_state(runner: dict[str, Any]) -> str:
    """One word for a volume runner's state: listening, catching up, failing, stopped."""
    if not runner.get("alive", True):
        return "stopped"
    if runner.get("failures"):
        return "failing"
    if runner.get("ready"):
        return "listening"
    return "starting" if runner.get("listening") else "opening"
