"""The warehouse tests' fixtures: moto's server in its own process, the AWS environment
pointing at it, and a fresh bucket per test (see tests/s3_warehouse_fixtures.py)."""

from tests.s3_warehouse_fixtures import moto_process, s3_bucket, s3_env  # noqa: F401
