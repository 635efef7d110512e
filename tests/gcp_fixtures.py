"""Fixtures for the GCS connectors: fake-gcs-server and the Pub/Sub fake `pstest` as real
processes, driven by google-cloud-storage / google-cloud-pubsub over the wire.

Tests import the fixtures they use explicitly:

    from tests.gcp_fixtures import gcp_emulators, gcp_env, gcs_rig  # noqa: F401

Both emulators are Go programs `make install` builds into the virtualenv's bin folder
(`make emulators`: fake-gcs-server with `go install`, pstest from tests/emulators/pstest);
tests never download them. `gcp_emulators` (session-scoped) starts them on free loopback ports
and waits until each answers; fake-gcs-server publishes its events to pstest
(`PUBSUB_EMULATOR_HOST`). `gcs_rig` wires a REAL bucket notification config (the JSON API's
notificationConfigs, what `gcloud storage buckets notifications create` makes) to a topic and
a subscription, so fake-gcs-server itself publishes each object change as GCS does.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = ["GcpEmulators", "GcsRig", "emulator_binary", "gcp_emulators", "gcp_env", "gcs_rig",
           "make_gcs_rig", "start_emulators"]

PROJECT = "vs-test"
BIN = Path(sys.executable).parent


def emulator_binary(name: str) -> str:
    """The path of an emulator `make emulators` built; fails the test run if it is missing."""
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: `make install` (its `emulators` target) builds it")
    return str(path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{name} did not listen on port {port} within {timeout} s")


@dataclass
class GcpEmulators:
    """Where the emulators listen, and their processes."""

    storage: str  # http://127.0.0.1:PORT
    pubsub: str  # 127.0.0.1:PORT
    procs: tuple[subprocess.Popen, ...]

    @property
    def env(self) -> dict[str, str]:
        """The variables pointing the SDKs (and volume-stream) at the emulators."""
        return {"STORAGE_EMULATOR_HOST": self.storage, "PUBSUB_EMULATOR_HOST": self.pubsub}

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_emulators() -> GcpEmulators:
    """Start pstest, then fake-gcs-server publishing to it; wait until both answer."""
    ps_port, gcs_port = free_port(), free_port()
    pubsub = subprocess.Popen([emulator_binary("pstest"), "-port", str(ps_port),
                               "-min-ack-deadline", "1s"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs: list[subprocess.Popen] = [pubsub]
    try:
        _wait_port(ps_port, pubsub, "pstest")
        env = {**os.environ, "PUBSUB_EMULATOR_HOST": f"127.0.0.1:{ps_port}"}
        gcs = subprocess.Popen(
            [emulator_binary("fake-gcs-server"), "-scheme", "http", "-host", "127.0.0.1",
             "-port", str(gcs_port), "-backend", "memory", "-log-level", "error",
             "-public-host", f"127.0.0.1:{gcs_port}"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(gcs)
        _wait_port(gcs_port, gcs, "fake-gcs-server")
    except BaseException:
        GcpEmulators("", "", tuple(procs)).stop()
        raise
    return GcpEmulators(f"http://127.0.0.1:{gcs_port}", f"127.0.0.1:{ps_port}", tuple(procs))


@pytest.fixture(scope="session")
def gcp_emulators() -> Iterator[GcpEmulators]:
    """fake-gcs-server and pstest on free loopback ports, for the whole session."""
    emulators = start_emulators()
    yield emulators
    emulators.stop()


@pytest.fixture
def gcp_env(gcp_emulators: GcpEmulators, monkeypatch: pytest.MonkeyPatch) -> GcpEmulators:
    """`STORAGE_EMULATOR_HOST` / `PUBSUB_EMULATOR_HOST` set (as a user of the emulators sets
    them), no ADC file."""
    for name, value in gcp_emulators.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    return gcp_emulators


@dataclass
class GcsRig:
    """A bucket whose notification config publishes to a topic with one subscription."""

    bucket_name: str
    topic: str
    subscription: str
    dead_letter: str  # the subscription of the dead-letter topic
    tap: str  # a second subscription of the topic, to see what was published
    storage: Any  # google.cloud.storage.Client
    publisher: Any
    subscriber: Any
    emulators: GcpEmulators

    @property
    def bucket(self) -> Any:
        return self.storage.bucket(self.bucket_name)

    def put(self, key: str, data: bytes | str) -> Any:
        blob = self.bucket.blob(key)
        blob.upload_from_string(data)
        return blob

    def delete(self, key: str) -> None:
        self.bucket.blob(key).delete()

    @property
    def options(self) -> dict[str, str]:
        """The explicit client options reaching the emulators (instead of the variables)."""
        return {"storage_endpoint": self.emulators.storage,
                "pubsub_endpoint": self.emulators.pubsub, "project": PROJECT}

    def publish(self, data: bytes, **attributes: str) -> str:
        """Publish a message of our own (foreign, malformed, replayed) to the topic."""
        return self.publisher.publish(topic=self.topic, messages=[
            {"data": data, "attributes": attributes}]).message_ids[0]

    def published(self, count: int, timeout: float = 20) -> list[Any]:
        """Wait until `count` more messages were published to the topic (fake-gcs-server
        publishes after its call returned); returns them. The tap subscription sees them."""
        seen: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(seen) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(seen)} of {count} messages were published")
            got = self.pending(self.tap, wait=1.0)
            if got:
                self.subscriber.acknowledge(subscription=self.tap,
                                            ack_ids=[m.ack_id for m in got])
                seen.extend(got)
        return seen

    def pending(self, subscription: str | None = None, *, wait: float = 1.0) -> list[Any]:
        """Pull what the subscription holds (with a short ack deadline), without acking."""
        from google.api_core.exceptions import Cancelled, DeadlineExceeded

        try:
            response = self.subscriber.pull(subscription=subscription or self.subscription,
                                            max_messages=1000, timeout=wait, retry=None)
        except (DeadlineExceeded, Cancelled):  # nothing came within `wait` (pstest may cancel
            return []                          # the stream at the deadline: RST_STREAM 8)
        return list(response.received_messages)


def make_gcs_rig(emulators: GcpEmulators, *, max_delivery_attempts: int = 5,
                 ack_deadline: int = 10, prefix: str | None = None) -> GcsRig:
    """A new bucket, topic, subscription (with a dead-letter topic after
    `max_delivery_attempts`) and the bucket's notification config for all four event types."""
    import grpc
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    from google.pubsub_v1 import PublisherClient, SubscriberClient
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

    tag = uuid.uuid4().hex[:10]
    publisher = PublisherClient(transport=PublisherGrpcTransport(
        channel=grpc.insecure_channel(emulators.pubsub)))
    subscriber = SubscriberClient(transport=SubscriberGrpcTransport(
        channel=grpc.insecure_channel(emulators.pubsub)))
    topic = f"projects/{PROJECT}/topics/events-{tag}"
    dead_topic = f"projects/{PROJECT}/topics/dead-{tag}"
    subscription = f"projects/{PROJECT}/subscriptions/events-{tag}"
    dead_letter = f"projects/{PROJECT}/subscriptions/dead-{tag}"
    tap = f"projects/{PROJECT}/subscriptions/tap-{tag}"
    publisher.create_topic(name=topic)
    publisher.create_topic(name=dead_topic)
    subscriber.create_subscription(name=dead_letter, topic=dead_topic, ack_deadline_seconds=10)
    subscriber.create_subscription(name=tap, topic=topic, ack_deadline_seconds=10)
    subscriber.create_subscription(request={
        "name": subscription, "topic": topic, "ack_deadline_seconds": ack_deadline,
        "dead_letter_policy": {"dead_letter_topic": dead_topic,
                               "max_delivery_attempts": max_delivery_attempts}})
    client = storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": emulators.storage})
    bucket = client.create_bucket(f"bkt-{tag}")
    notification = bucket.notification(
        topic_name=topic.rsplit("/", 1)[1], topic_project=PROJECT, payload_format="JSON_API_V1",
        blob_name_prefix=prefix,
        event_types=["OBJECT_FINALIZE", "OBJECT_DELETE", "OBJECT_ARCHIVE",
                     "OBJECT_METADATA_UPDATE"])
    notification.create()
    return GcsRig(bucket.name, topic, subscription, dead_letter, tap, client, publisher,
                  subscriber, emulators)


@pytest.fixture
def gcs_rig(gcp_emulators: GcpEmulators) -> GcsRig:
    return make_gcs_rig(gcp_emulators)
