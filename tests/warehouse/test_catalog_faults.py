"""Catalog writes on S3 through the fault proxy (20% of requests: 500s, resets, cut-off
bodies): a write that fails transiently is retried, and one whose commit landed before the
failure (a post-commit LIST cut off, a lost answer) is recognised by its mutation id in the
commit log, so every change is applied exactly once. moto and the proxy run in their own
processes."""

from __future__ import annotations

import volume_stream as vs
from tests.fakes.faulty_proxy_process import FaultyProxyProcess

CHANGES = 15


def bump(state):
    state.setdefault(("test", "counter"), {"n": 0})["n"] += 1


def test_catalog_changes_through_faults_are_applied_exactly_once(s3_env, s3_bucket):
    uri = f"s3://{s3_bucket}/wh"
    vs.connect(uri)  # the warehouse, made on moto directly
    with FaultyProxyProcess(s3_env, rate=0.2, faults=("error500", "reset", "truncate"),
                            seed=8, paused=True) as proxy:
        cat = vs.connect(uri, storage_options={"AWS_ENDPOINT_URL": proxy.endpoint})
        proxy.resume()
        for _ in range(CHANGES):
            cat.warehouse.mutate(bump)
        counts = proxy.counts()
    assert sum(n for k, n in counts.items() if k != "forwarded") > 0, counts
    assert vs.connect(uri).warehouse.read()[("test", "counter")] == {"n": CHANGES}
