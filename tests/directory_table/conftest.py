"""S3 fixtures (moto in its own process) for the directory-table tests that use them;
`threads`: the rewrite's file jobs on the writer threads or on the calling thread;
`rewrite_path`: touched files held in memory or streamed file by file."""

import pytest

from tests.s3_warehouse_fixtures import moto_process, s3_bucket, s3_env  # noqa: F401


@pytest.fixture(params=["threads", "one thread"])
def threads(request, monkeypatch):
    """Run the rewrite's file jobs on the writer threads, or all on the calling thread (what
    a busy machine gets: `filestore.spare_cores`)."""
    from directory_table import filestore

    monkeypatch.setattr(filestore, "spare_cores", lambda: request.param == "threads")
    return request.param


@pytest.fixture(params=["in memory", "streamed"])
def rewrite_path(request, monkeypatch):
    """Rewrite batches with the touched files held in memory, or file by file
    (`directory_table.streamed`, what a batch spread over a huge table gets)."""
    from directory_table import rewrite

    if request.param == "streamed":
        monkeypatch.setattr(rewrite, "MAX_LOADED_ROWS", 0)
    return request.param
