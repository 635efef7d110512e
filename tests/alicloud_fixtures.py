"""Pytest fixtures for the local MNS and OSS fakes, and a helper that wires a volume's pieces.

Import the fixtures a test module uses explicitly (they are not in conftest.py):

    from tests.alicloud_fixtures import alicloud_env, mns_server, oss_server  # noqa: F401

    def test_put(alicloud_env, mns_server, oss_server):
        vol = make_volume(mns_server, oss_server, prefix="in/")
        vol.oss.put_object("in/a.txt", b"x")      # real oss2 client -> fake OSS
        ...                                       # -> one notification in vol.queue_name

The servers are module-scoped (their threads are daemon threads named `fake-*`, so the leak
guard ignores them); `make_volume` gives each test its own bucket, queue and rule.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import oss2
import pytest
from mns.account import Account
from mns.queue import QueueMeta

from tests.fakes.mns_server import FakeMnsServer
from tests.fakes.oss_server import DEFAULT_EVENTS, FakeOssServer, NotificationRule

__all__ = ["FAKE_ACCESS_KEY_ID", "FAKE_ACCESS_KEY_SECRET", "AliCloudVolume", "alicloud_env",
           "make_volume", "mns_server", "oss_server", "vol"]

FAKE_ACCESS_KEY_ID = "LTAI5tFakeAccessKeyId01"
FAKE_ACCESS_KEY_SECRET = "fake-access-key-secret-0123456789"
_names = itertools.count(1)


@pytest.fixture(scope="module")
def mns_server():
    server = FakeMnsServer({FAKE_ACCESS_KEY_ID: FAKE_ACCESS_KEY_SECRET}).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oss_server(mns_server):
    server = FakeOssServer(mns_server.backend, {FAKE_ACCESS_KEY_ID: FAKE_ACCESS_KEY_SECRET}).start()
    yield server
    server.stop()


@pytest.fixture
def alicloud_env(monkeypatch):
    """The fake credentials in ALIBABA_CLOUD_ACCESS_KEY_ID / _SECRET; no security token."""
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", FAKE_ACCESS_KEY_ID)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", FAKE_ACCESS_KEY_SECRET)
    monkeypatch.delenv("ALIBABA_CLOUD_SECURITY_TOKEN", raising=False)
    return {"access_key_id": FAKE_ACCESS_KEY_ID, "access_key_secret": FAKE_ACCESS_KEY_SECRET}


@dataclass
class AliCloudVolume:
    """One test's bucket + queue + notification rule, with real SDK clients for both."""

    bucket: str
    queue_name: str
    prefix: str
    mns_endpoint: str
    oss_endpoint: str
    oss: oss2.Bucket
    queue: Any  # mns.queue.Queue (base64 encoding on, the SDK default)
    rule: NotificationRule

    def close(self) -> None:
        self.queue.mns_client.close_connection()


def make_volume(mns_server: FakeMnsServer, oss_server: FakeOssServer, *, prefix: str = "",
                rule_prefix: str = "", events: tuple[str, ...] = DEFAULT_EVENTS,
                base64_body: bool = True, time_precision: str = "s",
                visibility_timeout: int = 30) -> AliCloudVolume:
    """Create a fresh bucket, a queue, and a rule delivering the bucket's events to the queue.

    Args:
        prefix: The volume prefix the test means to use (recorded, not enforced).
        rule_prefix: The rule's key filter ('' = every key of the bucket).
        events: Event-name patterns the rule subscribes to.
        base64_body: Deliver base64(JSON) bodies (OSS's way) or plain JSON.
        time_precision: "s" (like real events, `.000Z`) or "ms".
        visibility_timeout: The queue's VisibilityTimeout in seconds.
    """
    n = next(_names)
    bucket, queue_name = f"bkt-{n}", f"q-{n}"
    auth = oss2.Auth(FAKE_ACCESS_KEY_ID, FAKE_ACCESS_KEY_SECRET)
    oss = oss2.Bucket(auth, oss_server.endpoint, bucket)
    oss.create_bucket()
    account = Account(mns_server.endpoint, FAKE_ACCESS_KEY_ID, FAKE_ACCESS_KEY_SECRET)
    queue = account.get_queue(queue_name)
    queue.create(QueueMeta(vis_timeout=visibility_timeout))
    rule = oss_server.backend.add_notification_rule(
        bucket, queue_name, prefix=rule_prefix, events=tuple(events), base64_body=base64_body,
        time_precision=time_precision, rule_id=f"rule-{n}")
    return AliCloudVolume(bucket, queue_name, prefix, mns_server.endpoint, oss_server.endpoint,
                          oss, queue, rule)


@pytest.fixture
def vol(mns_server, oss_server):
    """A fresh volume (bucket, queue with VisibilityTimeout 5 s, a rule for every key), closed
    after the test."""
    volume = make_volume(mns_server, oss_server, visibility_timeout=5)
    yield volume
    volume.close()
