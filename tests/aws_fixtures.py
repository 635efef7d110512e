"""Fixtures for the AWS connectors: moto's server over HTTP, fake credentials, a notified bucket.

Tests import the fixtures they use explicitly:

    from tests.aws_fixtures import aws_env, moto_server, notified_bucket  # noqa: F401

`moto_server` is session-scoped (its daemon threads are started before the per-test leak guard
looks). moto keeps one global state per process, so every bucket and queue gets a unique name.
`notified_bucket` wires a REAL bucket notification (QueueConfigurations), so moto itself delivers
S3 events to SQS as it does over HTTP.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

__all__ = ["RIG_VISIBILITY", "AwsRig", "aws_env", "make_rig", "moto_server", "notified_bucket",
           "queue_counts", "rig"]

FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}
UNSET_ENV = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION",
             "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_S3", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
             "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_WEB_IDENTITY_TOKEN_FILE",
             "AWS_ROLE_ARN")


def _atomic_sqs_deletes() -> None:
    """Make moto's SQS deletes atomic, as SQS's are. moto's `Queue.delete_message` rebuilds the
    queue's message list without a lock, so two concurrent DeleteMessageBatch calls (the
    listener acks in parallel chunks) could undo each other's deletes and the messages came
    back once visible: a fake's race that made queue-count assertions flaky."""
    from moto.sqs.models import Queue

    original = Queue.delete_message
    if getattr(original, "atomic", False):
        return
    lock = threading.Lock()

    def delete_message(self, receipt_handle):
        with lock:
            return original(self, receipt_handle)

    delete_message.atomic = True
    Queue.delete_message = delete_message


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """moto's server on a free loopback port; yields its endpoint URL."""
    _atomic_sqs_deletes()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Fake credentials and region, `AWS_ENDPOINT_URL` pointing at moto, no shared config
    files or instance metadata; yields the endpoint URL."""
    for name in UNSET_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in FAKE_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    return moto_server


@dataclass
class AwsRig:
    """A bucket whose object events go to a queue, and the clients to drive them."""

    endpoint: str
    bucket: str
    queue_url: str
    s3: Any
    sqs: Any

    def put(self, key: str, body: bytes = b"x") -> None:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=body)

    def send_raw(self, body: str | dict) -> None:
        self.sqs.send_message(QueueUrl=self.queue_url,
                              MessageBody=body if isinstance(body, str) else json.dumps(body))

    def purge(self) -> None:
        """Drop whatever is on the queue (e.g. the s3:TestEvent)."""
        self.sqs.purge_queue(QueueUrl=self.queue_url)


def make_rig(endpoint: str, *, prefix_filter: str | None = None, queue_attributes:
             dict[str, str] | None = None, notify: bool = True) -> AwsRig:
    """Create a uniquely named bucket and queue; with `notify`, a real bucket notification.

    Args:
        endpoint: moto's endpoint URL.
        prefix_filter: Restrict the notification to keys with this prefix.
        queue_attributes: Extra queue attributes (VisibilityTimeout, RedrivePolicy...).
        notify: Configure the bucket notification (s3:ObjectCreated:* and s3:ObjectRemoved:*).
    """
    kw = {"endpoint_url": endpoint, "region_name": "us-east-1",
          "aws_access_key_id": "testing", "aws_secret_access_key": "testing-secret"}
    s3, sqs = boto3.client("s3", **kw), boto3.client("sqs", **kw)
    name = f"vs-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    queue_url = sqs.create_queue(QueueName=name, Attributes=queue_attributes or {})["QueueUrl"]
    if notify:
        arn = sqs.get_queue_attributes(QueueUrl=queue_url,
                                       AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        config: dict[str, Any] = {"QueueArn": arn,
                                  "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]}
        if prefix_filter:
            config["Filter"] = {"Key": {"FilterRules": [{"Name": "prefix",
                                                         "Value": prefix_filter}]}}
        s3.put_bucket_notification_configuration(
            Bucket=name, NotificationConfiguration={"QueueConfigurations": [config]})
    return AwsRig(endpoint, name, queue_url, s3, sqs)


@pytest.fixture
def notified_bucket(moto_server: str) -> Iterator[AwsRig]:
    """A fresh bucket notifying a fresh queue (the queue starts with moto's s3:TestEvent)."""
    rig = make_rig(moto_server)
    yield rig
    rig.sqs.delete_queue(QueueUrl=rig.queue_url)


RIG_VISIBILITY = 2  # the `rig` queue's VisibilityTimeout, seconds


@pytest.fixture
def rig(aws_env: str) -> Iterator[AwsRig]:
    """A bucket notifying a queue (VisibilityTimeout 2 s) through the environment's endpoint
    (`aws_env`), the s3:TestEvent already gone."""
    rig = make_rig(aws_env, queue_attributes={"VisibilityTimeout": str(RIG_VISIBILITY)})
    rig.purge()
    yield rig
    rig.sqs.delete_queue(QueueUrl=rig.queue_url)


def queue_counts(rig: AwsRig, queue_url: str | None = None) -> tuple[int, int]:
    """(visible, in flight) messages of the rig's queue, per moto's approximate counters."""
    attrs = rig.sqs.get_queue_attributes(
        QueueUrl=queue_url or rig.queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (int(attrs["ApproximateNumberOfMessages"]),
            int(attrs["ApproximateNumberOfMessagesNotVisible"]))


def wait_until(predicate: Any, timeout: float = 5.0, interval: float = 0.05) -> Any:
    """Poll `predicate` until it returns something truthy or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
