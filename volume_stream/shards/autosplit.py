"""Shards that split on their own under load, as DynamoDB's do.

`cat.set_auto_split(volume, records_per_s=R, window_s=W)` stores a threshold in the change
log's metadata; `cat.auto_split(volume)` (run by the shard API server every few seconds, or by
any scheduler) measures each open shard's write rate over the last W seconds — its change
records in the versions committed then, divided by W — and splits every shard above R into
two children over the halves of its buckets (each naming it as parent). A shard younger than
W is not measured (its rate is not yet "staying" above the threshold), nor one of a single
bucket (it cannot be split).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from volume_stream.errors import converted
from volume_stream.shards import meta as shard_meta
from volume_stream.shards.log import ChangeLog
from volume_stream.shards.model import Shard
from volume_stream.shards.sources import key_texts

__all__ = ["auto_split", "shard_rates"]


def shard_rates(log: ChangeLog, window_s: float, now: datetime | None = None
                ) -> dict[str, float]:
    """{open shard id: change records per second over the last `window_s`} for the shards
    open for at least that long."""
    now = now or datetime.now(UTC)
    since = now - timedelta(seconds=window_s)
    with converted(f"{log.kind} {log.volume!r}"):
        history = log.source.history()
        times = {h["version"]: h["timestamp"] for h in history}
        recent = [h["version"] for h in history if h["timestamp"] > since]
        rates = {}
        for shard in log.shards():
            if shard.closed or shard.bucket_hi - shard.bucket_lo < 2:
                continue
            opened = times.get(shard.start_version)
            if opened is None or opened > since:
                continue
            if not recent:
                rates[shard.shard_id] = 0.0
                continue
            a = max(min(recent) - 1, shard.start_version)
            cdf = log.source.changes(a, max(recent), shard)
            keys = set(zip(cdf["_commit_version"].to_pylist(),
                           key_texts(cdf, log.source.key), strict=True))
            rates[shard.shard_id] = len(keys) / window_s
    return rates


def auto_split(catalog: Any, volume: str, now: datetime | None = None) -> list[Shard]:
    """Split the shards whose write rate is above the volume's threshold; returns the new
    children (none when no threshold is set or no shard is above it)."""
    log = ChangeLog(catalog, volume)
    settings = log.meta.get("auto_split")
    if not settings or not log.enabled:
        return []
    rates = shard_rates(log, settings["window_s"], now)
    hot = [sid for sid, rate in rates.items() if rate > settings["records_per_s"]]
    if not hot:
        return []
    with converted(f"{log.kind} {volume!r}"):
        children = shard_meta.split(catalog.warehouse, log.meta_name, hot, log.source.version)
    return [Shard.from_meta(c, log.meta["buckets"]) for c in children]
