"""The warehouse tests' fixtures: moto's server in its own process, the AWS environment
pointing at it, a fresh bucket per test, and that environment on Spark's executors (see
tests/s3_warehouse_fixtures.py)."""

from tests.s3_warehouse_fixtures import moto_process, s3_bucket, s3_env, s3_executors  # noqa: F401
