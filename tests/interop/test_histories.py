"""Random event histories, committed by randomly chosen write paths (delta-rs append/merge,
our commit writer, compaction): Delta Spark's change feed must be ours version by version, and
its latest rows ours. A few examples in `make test` (each costs two Spark reads); more with
`HYPOTHESIS_PROFILE=soak`."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.events import FileEvent
from directory_table import DirectoryTable
from directory_table.schema import BUCKETED_SCHEMA
from tests.interop import judge

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PATHS = ["a", "b", "c/d.csv", "c/e.csv", "f", "g/h/i"]
COLUMNS = [*BUCKETED_SCHEMA.names, *judge.CDF_META]
EXAMPLES = 40 if os.environ.get("HYPOTHESIS_PROFILE") == "soak" else 6

event = st.tuples(st.sampled_from(PATHS), st.integers(0, 3))  # size 0: a delete
batch = st.tuples(st.sampled_from(["merge", "ours", "compact"]),
                  st.lists(event, min_size=1, max_size=6))


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(history=st.lists(batch, min_size=1, max_size=6))
def test_spark_change_feed_is_ours_for_random_histories(delta_spark, tmp_path_factory,
                                                        history):
    table = DirectoryTable.create(str(tmp_path_factory.mktemp("h")), "file:///d/", buckets=2)
    tick = 0
    compactions = set()
    for how, events in history:
        if how == "compact":
            if table.optimize(max_files_per_bucket=1, checkpoint=False).buckets_compacted:
                compactions.add(table.version())
            continue
        batch_events = []
        for path, size in events:
            tick += 1
            t = T0 + timedelta(seconds=tick)
            batch_events.append(
                FileEvent.removed(path, event_time=t) if size == 0 else
                FileEvent.created(path, size=size, etag=f"e{tick}", last_modified_time=t,
                                  event_time=t))
        table.rewrite_min_events = None if how == "merge" else 1
        table.apply(batch_events)
    latest = table.version()
    assert judge.rows(judge.spark_table(delta_spark, table.path), BUCKETED_SCHEMA.names) == \
        judge.rows(table.snapshot(columns=BUCKETED_SCHEMA.names), BUCKETED_SCHEMA.names)
    if latest == 0:
        return
    theirs = judge.rows(judge.spark_changes(delta_spark, table.path, 0, latest), COLUMNS)
    version = COLUMNS.index("_commit_version")
    for v in range(1, latest + 1):
        ours = judge.rows(table.changes(v - 1, v), COLUMNS)
        assert [r for r in theirs if r[version] == v] == ours, f"version {v} of {history}"
        if v in compactions:
            assert not ours
