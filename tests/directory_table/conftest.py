"""S3 fixtures (moto in its own process) for the directory-table tests that use them."""

from tests.s3_warehouse_fixtures import moto_process, s3_bucket, s3_env  # noqa: F401
