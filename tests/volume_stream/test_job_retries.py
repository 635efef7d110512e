"""Pipeline jobs retry a step that fails transiently (a store answering 503, a cut-off body):
safe because a batch's range is pinned in the catalog and its target skips what it holds."""

from __future__ import annotations

import pytest

from volume_stream.cli import jobs
from volume_stream.errors import InvalidInputError, SourceError


def test_a_transient_failure_is_retried_a_permanent_one_is_not():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            # what a delta-rs read cut off by the network looks like, converted at the edge
            raise SourceError("stream 'p': failed") from OSError(
                "Kernel error -> Generic S3 error: Error performing GET http://h/b/_delta_log/"
                "_last_checkpoint - HTTP error: request or response body error: end of file "
                "before message length reached")
        return "done"

    assert jobs._retrying("batch", flaky) == "done"
    assert len(calls) == 3

    def bad():
        calls.append(1)
        raise InvalidInputError("no such option")

    calls.clear()
    with pytest.raises(InvalidInputError):
        jobs._retrying("batch", bad)
    assert len(calls) == 1
