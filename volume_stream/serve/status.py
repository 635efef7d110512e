"""The facts of a warehouse at a glance, gathered in one place (DESIGN §8.3).

`StatusSource(catalog).status()` is what the status page (`/`), its JSON twin
(`/status.json`) and `volume-stream status [--json]` show: every volume (location, files,
bytes, latest version and commit time, and under a daemon its listener's state), every stream
(offset, latest version, pending changes, stale or not, how long the oldest pending commit has
waited), the daemon's pipelines, the change logs (shards), and the SQL tables with their
streams and change logs (`serve.table_facts`); a stream's page adds its last consumed batches
(version range, records, when). `file_history` is every change record of one file, oldest
first. Everything here only reads.

    source = StatusSource(connect("./warehouse"))
    facts = source.status()          # plain JSON-able dicts and lists
    source.file_history("landing", "a/b.csv")

The catalog is read once per call; each volume's table stays open in a `VolumeFacts`
(`serve.facts`), which reads only the commits made since the last call: a poll of an idle
warehouse lists the logs and reads nothing else, and pending changes cost O(new changes) once
per (volume, mode, offset, version), never O(files). Calls closer than `min_interval_s` share
one computation. A fact that cannot be read (a volume whose table is gone, a stream whose
volume was replaced) becomes an `error` entry beside the others, never a failed page.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from volume_stream.errors import InvalidInputError, VolumeStreamError, converted
from volume_stream.serve.charts import DEFAULT_RANGE, RANGES, Timeline, charts
from volume_stream.serve.facts import VolumeFacts
from volume_stream.serve.file_history import file_history
from volume_stream.serve.table_facts import table_rows
from volume_stream.streams.registry import pinned_end
from volume_stream.volumes.spec import VolumeSpec
from volume_stream.warehouse import STREAM, VOLUME

__all__ = ["StatusSource", "Live"]

#: What a daemon knows that the warehouse does not: {"volumes": {name: runner status},
#: "pipelines": {name: runner status}} (see `Daemon.live_status`).
Live = Callable[[], dict[str, Any]]

_CHANGE_LOG = "change_log"  # volume_stream.shards.meta.CHANGE_LOG (a feature: not imported)


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        value = value if value.tzinfo else value.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat(timespec="seconds")
    return str(value)


_PLAIN = (str, int, float, bool, type(None))


def _plain(value: Any) -> Any:
    """A value JSON can hold (datetimes as ISO 8601 text)."""
    if type(value) in _PLAIN:
        return value
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
        min_interval_s: `status()` calls closer than this share one result.
        refresh_budget_s: Time one `status()` may spend bringing volumes up to date, the
            least recently looked at first (None: all of them, every call). With many busy
            volumes a row may then lag a few polls; the page's cost stays bounded.

    Example:
        >>> facts = StatusSource(connect("./warehouse")).status()
        >>> [v["name"] for v in facts["volumes"]]
        ['landing']
    """

    def __init__(self, catalog: Any, live: Live | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 timeline: Timeline | None = None, min_interval_s: float = 1.0,
                 refresh_budget_s: float | None = 0.2) -> None:
        self.catalog = catalog
        self.live = live
        self.clock = clock
        self.min_interval_s = min_interval_s
        self.refresh_budget_s = refresh_budget_s
        self._own_timeline = timeline is None
        self.timeline = Timeline() if timeline is None else timeline
        self._lock = threading.Lock()
        self._status_lock = threading.Lock()
        self._last: tuple[float, dict[str, Any]] | None = None
        self._facts: dict[tuple[str, str], VolumeFacts] = {}
        #: each volume stream's last row, and what it was computed from
        self._rows: dict[str, tuple[tuple, dict[str, Any]]] = {}

    # ------------------------------------------------------------------ the whole picture
    def status(self, span_s: float = RANGES[DEFAULT_RANGE]) -> dict[str, Any]:
        """Every volume, stream, pipeline and change log, as plain JSON-able values, and the
        charts over the last `span_s` seconds.

        Pages polling at once share one computation: facts younger than `min_interval_s`
        are handed out again (each with the charts of its own range)."""
        with self._status_lock:
            if self._last is None or \
                    time.monotonic() - self._last[0] >= self.min_interval_s:
                self._last = (time.monotonic(), self._status())
            facts, histories, now = self._last[1]
        return {**facts, "charts": _plain(charts(histories, self.timeline, now=now,
                                                 span_s=span_s))}

    def _status(self) -> tuple[dict[str, Any], list[tuple[list[datetime], bool]], float]:
        now = self.clock()
        live = self._live()
        state = self.catalog.warehouse.read()
        histories: list[tuple[list[datetime], bool]] = []
        volumes = self.volumes(live, histories, state=state, budget_s=self.refresh_budget_s)
        facts = {
            "generated_at": _iso(now),
            "warehouse": str(self.catalog.warehouse.uri),
            "daemon": self.live is not None,
            "volumes": volumes,
            "streams": self.streams(now, state=state),
            "pipelines": self.pipelines(live),
            "change_logs": self.change_logs(state),
            "tables": table_rows(self.catalog.tables, state, _error),
        }
        facts["summary"] = {
            "volumes": len(volumes),
            "files": sum(v.get("files") or 0 for v in volumes),
            "bytes": sum(v.get("bytes") or 0 for v in volumes),
            "streams": len(facts["streams"]),
            "tables": len(facts["tables"]),
            "pending_changes": sum(s.get("pending_changes") or 0 for s in facts["streams"]),
            "stale_streams": sum(1 for s in facts["streams"] if s.get("stale")),
            "errors": sum(1 for part in ("volumes", "streams", "pipelines", "tables")
                          for row in facts[part] if row.get("error")),
        }
        if self._own_timeline:
            self.timeline.record({"pending": facts["summary"]["pending_changes"]},
                                 at=now.timestamp())
        streams = facts.pop("streams")  # built of plain values already: 1,000 rows unwalked
        return {**_plain(facts), "streams": streams}, histories, now.timestamp()

    def _live(self) -> dict[str, Any]:
        if self.live is None:
            return {}
        try:
            return self.live() or {}
        except Exception as exc:  # a daemon shutting down: show the warehouse anyway
            return {"error": _error(exc)}

    # ------------------------------------------------------------------ kept tables
    def _volume_facts(self, spec: VolumeSpec) -> VolumeFacts:
        """The kept facts of the volume `spec` describes (a replaced volume gets new ones)."""
        key = (spec.name, spec.id)
        with self._lock:
            facts = self._facts.get(key)
            if facts is None:
                facts = self._facts[key] = VolumeFacts(self.catalog.volumes.table(spec))
            return facts

    def _named(self, name: str) -> VolumeFacts:
        """The kept facts of volume `name`, brought up to date (NotFoundError naming the
        volumes there are)."""
        data = self.catalog.warehouse.read().get((VOLUME, name))
        if data is None:
            self.catalog.describe_volume(name)  # raises the NotFoundError
        facts = self._volume_facts(VolumeSpec.from_dict(data))
        with converted(f"volume {name!r}"):
            facts.refresh()
        return facts

    def _forget_others(self, state: dict) -> None:
        kept = {(n, d["id"]) for (k, n), d in state.items() if k == VOLUME}
        with self._lock:
            self._facts = {k: v for k, v in self._facts.items() if k in kept}

    # ------------------------------------------------------------------ volumes
    def volumes(self, live: dict[str, Any] | None = None,
                histories: list[tuple[list[datetime], bool]] | None = None, *,
                state: dict | None = None, budget_s: float | None = None
                ) -> list[dict[str, Any]]:
        """One row per volume; under a daemon with its listener's state. `histories` gets
        each volume's commit times read (and whether they are all of them) for the charts.

        `budget_s`: bring volumes up to date, the least recently looked at first, only until
        this much time is spent (a volume never looked at always is); the others show what
        they held at their last look. None: every volume."""
        runners = (live or {}).get("volumes", {})
        state = self.catalog.warehouse.read() if state is None else state
        self._forget_others(state)
        specs = {name: VolumeSpec.from_dict(data)
                 for (kind, name), data in sorted(state.items()) if kind == VOLUME}
        failed: dict[str, str] = {}
        order = sorted(specs, key=lambda n: self._volume_facts(specs[n]).looked_at)
        deadline = None if budget_s is None else time.monotonic() + budget_s
        for name in order:
            facts = self._volume_facts(specs[name])
            if facts.version is not None and deadline is not None \
                    and time.monotonic() > deadline:
                break
            try:
                with converted(f"volume {name!r}"):
                    facts.refresh()
            except Exception as exc:
                failed[name] = _error(exc)
        rows = []
        for name, spec in specs.items():
            notification = (spec.notification or {}).get(
                "type", "LOCAL" if spec.scheme == "file" else None)
            row: dict[str, Any] = {"name": name, "location": spec.location,
                                   "notification": notification, "recursive": spec.recursive,
                                   "version": None, "files": None}
            facts = self._volume_facts(spec)
            if name in failed or facts.version is None:
                row["error"] = failed.get(name, "not read yet")
            else:
                last = facts.history[:1]
                row.update(version=facts.version, files=facts.files, bytes=facts.bytes,
                           last_commit=_iso(last[0]["timestamp"]) if last else None,
                           last_operation=last[0]["operation"] if last else None)
                if histories is not None:
                    histories.append(([h["timestamp"] for h in facts.history],
                                      facts.complete))
            runner = runners.get(name)
            row["listener"] = None if runner is None else {
                "state": _listener_state(runner), **runner}
            rows.append(row)
        return rows

    def volume(self, name: str, commits: int = 20) -> dict[str, Any]:
        """One volume: its description, listener and latest `commits` commits, newest first."""
        info = self.catalog.describe_volume(name)
        runner = self._live().get("volumes", {}).get(name)
        facts = self._named(name)
        info["bytes"] = facts.bytes
        history = facts.history[:commits]
        info["listener"] = None if runner is None else {"state": _listener_state(runner),
                                                        **runner}
        info["history"] = [{"version": h["version"], "timestamp": _iso(h["timestamp"]),
                            "operation": h["operation"], "metrics": h.get("metrics") or {}}
                           for h in history]
        info["streams"] = [s["name"] for s in self.catalog.list_streams()
                           if s.get("volume") == name]
        return _plain(info)

    # ------------------------------------------------------------------ streams
    def streams(self, now: datetime | None = None, *, state: dict | None = None
                ) -> list[dict[str, Any]]:
        """One row per stream (on a volume or a table): offset, latest version, pending
        changes, stale, and how long its oldest pending commit has waited."""
        now = now or self.clock()
        state = self.catalog.warehouse.read() if state is None else state
        rows, lowest, specs = [], {}, {}
        for (kind, name), spec in sorted(state.items()):
            if kind != STREAM:
                continue
            on_table = spec.get("table") is not None
            row: dict[str, Any] = {
                "name": name, "on": "table" if on_table else "volume",
                "source": spec.get("table") if on_table else spec.get("volume"),
                "mode": spec.get("mode"), "offset": spec.get("offset"),
                "batch_id": spec.get("batch_id")}
            try:
                volume = None if on_table else state.get((VOLUME, spec["volume"]))
                if volume is None or volume["id"] != spec.get("volume_id"):
                    info = self.catalog.describe_stream(name)  # a table's; or the error
                    row.update(latest_version=info.get("latest_version"),
                               oldest_version=info.get("oldest_version"),
                               pending_changes=info.get("pending_changes"),
                               stale=bool(info.get("stale")), pinned_end=info.get("pinned_end"))
                    if info.get("latest_version") is None and info.get("stale_reason"):
                        row["error"] = info["stale_reason"]  # its volume or table is gone
                else:
                    if spec["volume"] not in specs:
                        specs[spec["volume"]] = VolumeSpec.from_dict(volume)
                    facts = self._volume_facts(specs[spec["volume"]])
                    lowest[id(facts)] = (facts, min(spec["offset"],
                                                    lowest.get(id(facts), (0, 1 << 62))[1]))
                    if facts.version is None:  # volumes() looked at the others
                        with converted(f"stream {name!r}"):
                            facts.refresh()
                    key = (name, repr(spec), id(facts), facts.version, facts.oldest)
                    kept = self._rows.get(name)
                    if kept is not None and kept[0] == key:  # nothing moved: the same row
                        rows.append(self._aged(dict(kept[1]), now))
                        continue
                    with converted(f"stream {name!r}"):
                        pending = facts.pending(spec["mode"], spec["offset"],
                                                initial_pending=spec.get("initial_pending",
                                                                         False))
                    row.update(latest_version=facts.version, oldest_version=facts.oldest,
                               pending_changes=pending, stale=pending is None,
                               pinned_end=pinned_end(spec))
                    row["versions_behind"] = max(facts.version - spec["offset"], 0)
                    row["waiting_since"] = (_iso(facts.first_commit_after(spec["offset"]))
                                            if row["versions_behind"] else None)
                    self._rows[name] = (key, row)
                    rows.append(self._aged(dict(row), now))
                    continue
            except Exception as exc:
                rows.append({**row, "error": _error(exc)})
                continue
            row["versions_behind"] = max((row["latest_version"] or 0) - (row["offset"] or 0), 0)
            row["waiting_since"] = None  # a table stream's commits are not dated here
            rows.append(self._aged(row, now))
        for facts, offset in lowest.values():
            facts.keep_from(offset)
        names = {r["name"] for r in rows}
        self._rows = {k: v for k, v in self._rows.items() if k in names}
        return rows

    @staticmethod
    def _aged(row: dict[str, Any], now: datetime) -> dict[str, Any]:
        """`row` with `staleness_s`: how long its oldest pending commit has waited, now."""
        since = row["waiting_since"]
        row["staleness_s"] = (None if since is None else round(
            (now - datetime.fromisoformat(since)).total_seconds(), 1))
        return row

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
        stored = self.catalog.warehouse.read().get((STREAM, name)) or {}
        consumed = list(reversed(stored.get("consumed", [])))  # newest first
        return _plain({**row, "records": records, "records_shown": len(records),
                       "consumed": consumed})

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

    def change_logs(self, state: dict | None = None) -> list[dict[str, Any]]:
        """The change logs (shards) of volumes and tables, from the catalog alone."""
        rows = []
        state = self.catalog.warehouse.read() if state is None else state
        for (kind, name), meta in sorted(state.items()):
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
        facts = self._named(volume)
        with facts.lock:
            times = {h["version"]: _iso(h["timestamp"]) for h in facts.history}
            return _plain(file_history(facts.table, volume, path, times))


def _listener_state(runner: dict[str, Any]) -> str:
    """One word for a volume runner's state: listening, catching up, failing, stopped."""
    if not runner.get("alive", True):
        return "stopped"
    if runner.get("failures"):
        return "failing"
    if runner.get("ready"):
        return "listening"
    return "starting" if runner.get("listening") else "opening"
