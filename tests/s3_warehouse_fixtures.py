"""Fixtures for warehouses on S3: moto's server in its OWN process, and a bucket per test.

delta-rs must talk to a server in another process: an in-process `ThreadedMotoServer`
deadlocks delta-rs calls such as `load_cdf` (the GIL is held while delta-rs blocks on the
server's answer). Import what you use:

    from tests.s3_warehouse_fixtures import moto_process, s3_env, s3_bucket  # noqa: F401
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator

import boto3
import pytest

__all__ = ["S3_ENV", "free_port", "moto_process", "s3_bucket", "s3_client", "s3_env",
           "s3_executors", "start_moto", "stop_process"]

#: fake credentials and the switches delta-rs needs to speak plain HTTP to moto
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}
_UNSET = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL_S3",
          "AWS_ENDPOINT_URL_SQS", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto(timeout: float = 60) -> tuple[subprocess.Popen, str]:
    """`python -m moto.server -p PORT` in its own process; returns it once it answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).read()
            return proc, endpoint
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_process(proc)
                raise RuntimeError(f"moto's server did not start on {endpoint}") from None
            time.sleep(0.1)


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def moto_process() -> Iterator[str]:
    """moto's server (own process) for the whole session; yields its endpoint URL."""
    proc, endpoint = start_moto()
    yield endpoint
    stop_process(proc)


@pytest.fixture
def s3_env(moto_process: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The standard AWS environment pointing at moto (what a container or an executor would
    have); yields the endpoint."""
    for name in _UNSET:
        monkeypatch.delenv(name, raising=False)
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_process)
    return moto_process


@pytest.fixture
def s3_executors(spark, s3_env: str, monkeypatch: pytest.MonkeyPatch):
    """The session's Spark with `s3_env`'s AWS environment on its executors too, as a cluster's
    executors get credentials from their role or image; yields the session. Spark's Python
    workers take the environment the JVM started with (before this test set `s3_env`) plus
    `SparkContext.environment` (`spark.executorEnv.*`): without this, their pyarrow S3 writes
    go out unsigned, which real S3 refuses and moto takes (DESIGN §7)."""
    for name, value in {**S3_ENV, "AWS_ENDPOINT_URL": s3_env}.items():
        monkeypatch.setitem(spark.sparkContext.environment, name, value)
    return spark


def s3_client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing-secret")


@pytest.fixture
def s3_bucket(s3_env: str) -> str:
    """A new, empty bucket on moto (moto's state is shared: every test gets its own name)."""
    name = f"wh-{uuid.uuid4().hex[:12]}"
    s3_client(s3_env).create_bucket(Bucket=name)
    return name


def child_env(endpoint: str) -> dict[str, str]:
    """An environment for a child process (daemon, job) that talks to moto."""
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    env.update(S3_ENV, AWS_ENDPOINT_URL=endpoint)
    return env
