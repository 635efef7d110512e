"""Drivers that make the same file changes on each backend a volume can live on, for the stream
semantics scenarios (tests/volume_stream/test_semantics_backends.py).

Every driver registers a volume named "vol" and has one small interface:

    put(path, size)   create or overwrite `path` with `size` bytes
    rm(path)          delete `path`
    sync()            commit what changed; the new version, or None when nothing did

A local folder commits by refresh; S3 (moto), OSS (the local fake) and Azure (Azurite, with the
Event Grid messages tests/azure_fixtures.py makes) commit by watching the notifications their
writes produced, under the key prefix `in/`.
"""

from __future__ import annotations

import time
from pathlib import Path

import volume_stream as vs
from tests.alicloud_fixtures import AliCloudVolume
from tests.aws_fixtures import AwsRig, queue_counts

__all__ = ["PREFIX", "AzureDriver", "Clock", "LocalDriver", "OssDriver", "S3Driver"]

PREFIX = "in/"  # where the S3 and OSS drivers keep the volume's objects


class LocalDriver:
    """Files in a folder, committed by refresh."""

    def __init__(self, cat, root: Path) -> None:
        self.cat, self.root = cat, root
        cat.create_volume("vol", root)

    def put(self, path: str, size: int) -> None:
        (self.root / path).write_bytes(b"x" * size)

    def rm(self, path: str) -> None:
        (self.root / path).unlink()

    def sync(self) -> int | None:
        return self.cat.refresh("vol").version


class _WatchedDriver:
    """Commits by draining the volume's notification queue: at most one version a sync."""

    cat: vs.Catalog

    def sync(self) -> int | None:
        versions = self.cat.watch("vol", until_idle=True, timeout=60,
                                  refresh=False).versions  # the queue alone
        assert len(versions) <= 1, versions
        self.check_drained()
        return versions[0] if versions else None

    def check_drained(self) -> None:
        """Assert whatever the backend can tell about its queue being empty after a watch."""


class S3Driver(_WatchedDriver):
    """Objects in moto's S3, committed by watching their SQS events."""

    def __init__(self, cat, rig: AwsRig) -> None:
        self.cat, self.rig = cat, rig
        note = vs.SqsNotification(rig.queue_url, wait_time_seconds=0)
        cat.create_volume("vol", f"s3://{rig.bucket}/{PREFIX}", notification=note)

    def put(self, path: str, size: int) -> None:
        self.rig.put(PREFIX + path, b"x" * size)

    def rm(self, path: str) -> None:
        self.rig.s3.delete_object(Bucket=self.rig.bucket, Key=PREFIX + path)

    def check_drained(self) -> None:
        assert queue_counts(self.rig) == (0, 0)


class Clock:
    """Keeps a later event on a path in a later second than the last one (OSS eventTime is
    whole seconds; a tie with the stored state is ignored)."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}

    def gap(self, *paths: str) -> None:
        newest = max((self.last.get(p, -1) for p in paths), default=-1)
        wait = newest + 1 - time.time()
        if wait > 0:
            time.sleep(wait + 0.01)

    def mark(self, *paths: str) -> None:
        for p in paths:
            self.last[p] = int(time.time())


class OssDriver(_WatchedDriver):
    """Objects in the fake OSS, committed by watching their MNS events."""

    def __init__(self, cat, vol: AliCloudVolume) -> None:
        self.cat, self.vol, self.clock = cat, vol, Clock()
        note = vs.MnsNotification(vol.mns_endpoint, vol.queue_name, wait_seconds=0)
        cat.create_volume("vol", f"oss://{vol.bucket}/{PREFIX}", endpoint=vol.oss_endpoint,
                          notification=note)

    def put(self, path: str, size: int) -> None:
        self.clock.gap(path)
        self.vol.oss.put_object(PREFIX + path, b"x" * size)
        self.clock.mark(path)

    def rm(self, path: str) -> None:
        self.clock.gap(path)
        self.vol.oss.delete_object(PREFIX + path)
        self.clock.mark(path)


class AzureDriver(_WatchedDriver):
    """Blobs in Azurite, committed by watching the Event Grid messages the rig delivers."""

    def __init__(self, cat, rig) -> None:
        self.cat, self.rig = cat, rig
        note = vs.AzureQueueNotification(rig.queue_name, wait_seconds=0)
        cat.create_volume("vol", f"abfss://{rig.container}@{rig.account}.dfs.core.windows.net/"
                                 f"{PREFIX}", notification=note)

    def put(self, path: str, size: int) -> None:
        self.rig.put(PREFIX + path, b"x" * size)

    def rm(self, path: str) -> None:
        self.rig.delete(PREFIX + path)

    def check_drained(self) -> None:
        assert self.rig.counts() == (0, 0)
