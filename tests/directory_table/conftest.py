"""S3 fixtures (moto in its own process) for the directory-table tests that use them, and
`threads`: the rewrite's file jobs on the writer threads or on the calling thread."""

import pytest

from tests.s3_warehouse_fixtures import moto_process, s3_bucket, s3_env  # noqa: F401


@pytest.fixture(params=["threads", "one thread"])
def threads(request, monkeypatch):
    """Run the rewrite's file jobs on the writer threads, or all on the calling thread (what
    a busy machine gets: `filestore.spare_cores`)."""
    from directory_table import filestore

    monkeypatch.setattr(filestore, "spare_cores", lambda: request.param == "threads")
    return request.param
