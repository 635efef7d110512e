"""Fixtures for the Azure connectors: Azurite (Microsoft's emulator, from npm) for Blob and
Queue storage, and the Event Grid messages Azurite does not emit.

Tests import the fixtures they use explicitly:

    from tests.azure_fixtures import azurite, azure_env, azure_rig  # noqa: F401

`azurite` is session-scoped: one Azurite process (blob + queue, in memory, API version check
off, free ports) started from `.venv/node` (`make emulators` installs it; tests never
download). `azure_env` points the standard variable `AZURE_STORAGE_CONNECTION_STRING` at it,
so any process (a daemon, a Spark executor) finds it as it would a real account's.

**What the rig makes up, and how.** Azurite emits no Event Grid events, so `AzureRig` writes
each blob with the real SDK, reads back its real properties (ETag, size, Last-Modified) and
puts on the queue the message Event Grid would: the event in the documented Event Grid (or
CloudEvents 1.0) schema of "Azure Blob Storage as an Event Grid source", its JSON
base64-encoded as Event Grid writes it to a Storage Queue. The one field no emulator can give
is `data.sequencer`: the rig numbers its own writes and deletes (it is the only writer of its
container) and writes the count in the shape Azure's have, 32 upper-case hex digits, so events
of one blob order as the service's would. Everything else (ids, topic, url) is what the event
of that write would say.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SESSION_CHILDREN
from tests.s3_warehouse_fixtures import free_port, stop_process

__all__ = ["ACCOUNT", "AZURITE_KEY", "AzureRig", "azure_env", "azure_executors", "azure_rig",
           "azurite",
           "azurite_binary", "connection_string", "event_message", "start_azurite"]

ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")
TOPIC = (f"/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/providers/"
         f"Microsoft.Storage/storageAccounts/{ACCOUNT}")


def azurite_binary() -> Path:
    """Azurite as `make emulators` installs it: `<venv>/node/node_modules/.bin/azurite`."""
    return Path(sys.prefix) / "node" / "node_modules" / ".bin" / "azurite"


@dataclass(frozen=True)
class Azurite:
    blob: str
    queue: str

    @property
    def connection_string(self) -> str:
        return connection_string(self.blob, self.queue)


def connection_string(blob: str, queue: str) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={blob};QueueEndpoint={queue};")


def start_azurite(workdir: str, timeout: float = 60) -> tuple[subprocess.Popen, Azurite]:
    """Azurite (blob + queue) on free ports in its own process; returned once both answer."""
    binary = azurite_binary()
    if not binary.exists():
        raise RuntimeError(f"Azurite is not installed at {binary}: run `make emulators` "
                           "(npm install azurite into the venv)")
    ports = {name: free_port() for name in ("blob", "queue", "table")}
    args = [str(binary), "--silent", "--inMemoryPersistence", "--skipApiVersionCheck",
            "--disableTelemetry",
            "--blobHost", "127.0.0.1", "--blobPort", str(ports["blob"]),
            "--queueHost", "127.0.0.1", "--queuePort", str(ports["queue"]),
            "--tableHost", "127.0.0.1", "--tablePort", str(ports["table"])]
    log = open(Path(workdir) / "azurite.log", "wb")  # noqa: SIM115 - the process keeps it
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    log.close()
    emulator = Azurite(f"http://127.0.0.1:{ports['blob']}/{ACCOUNT}",
                       f"http://127.0.0.1:{ports['queue']}/{ACCOUNT}")
    from azure.core.exceptions import AzureError
    from azure.storage.blob import BlobServiceClient
    from azure.storage.queue import QueueServiceClient

    deadline = time.monotonic() + timeout
    while True:
        try:
            BlobServiceClient.from_connection_string(
                emulator.connection_string, retry_total=0).get_service_properties()
            QueueServiceClient.from_connection_string(
                emulator.connection_string, retry_total=0).get_service_properties()
            return proc, emulator
        except AzureError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_process(proc)
                text = (Path(workdir) / "azurite.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"Azurite did not start: {text}") from None
            time.sleep(0.2)


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """One Azurite for the session (blob + queue, in memory)."""
    workdir = tempfile.mkdtemp(prefix="azurite-")
    proc, emulator = start_azurite(workdir)
    SESSION_CHILDREN.add(proc.pid)  # may start inside a test (getfixturevalue): not its leak
    yield emulator
    stop_process(proc)
    SESSION_CHILDREN.discard(proc.pid)
    shutil.rmtree(workdir, ignore_errors=True)


_AZURE_VARS = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME",
               "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_KEY",
               "AZURE_STORAGE_SAS_TOKEN")


@pytest.fixture
def azure_env(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> Azurite:
    """`AZURE_STORAGE_CONNECTION_STRING` pointing at Azurite (nothing else Azure set)."""
    for name in _AZURE_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    return azurite


def event_message(kind: str, container: str, name: str, *, sequencer: str,
                  etag: str | None = None, size: int | None = None,
                  when: datetime | None = None, schema: str = "eventgrid",
                  api: str | None = None, account: str = ACCOUNT,
                  encode: bool = True) -> str:
    """The queue message Event Grid writes for one blob event (`kind`: "BlobCreated",
    "BlobDeleted", ...), in the documented schema; base64 unless `encode=False`."""
    when = when or datetime.now(UTC)
    data: dict[str, Any] = {
        "api": api or {"BlobCreated": "PutBlob", "BlobDeleted": "DeleteBlob"}.get(kind, kind),
        "clientRequestId": str(uuid.uuid4()), "requestId": str(uuid.uuid4()),
        "contentType": "application/octet-stream", "blobType": "BlockBlob",
        "url": f"https://{account}.blob.core.windows.net/{container}/{name}",
        "sequencer": sequencer,
        "storageDiagnostics": {"batchId": str(uuid.uuid4())},
    }
    if etag is not None:
        data["eTag"] = etag
    if size is not None:
        data["contentLength"] = size
    topic = TOPIC.replace(ACCOUNT, account)
    common = {"subject": f"/blobServices/default/containers/{container}/blobs/{name}",
              "id": str(uuid.uuid4()), "data": data}
    stamp = when.strftime("%Y-%m-%dT%H:%M:%S.%f") + "0Z"  # Event Grid's seven digits
    if schema == "cloudevents":
        event = {"source": topic, "type": f"Microsoft.Storage.{kind}", "time": stamp,
                 **common, "specversion": "1.0"}
    else:
        event = {"topic": topic, "eventType": f"Microsoft.Storage.{kind}", "eventTime": stamp,
                 **common, "dataVersion": "", "metadataVersion": "1"}
    text = json.dumps(event)
    return base64.b64encode(text.encode()).decode() if encode else text


@dataclass
class AzureRig:
    """A container and a queue on Azurite; writes blobs and delivers their events."""

    emulator: Azurite
    container: str
    queue_name: str
    schema: str = "eventgrid"
    _counter: Any = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    account: str = ACCOUNT

    @property
    def blobs(self) -> Any:
        from azure.storage.blob import ContainerClient

        return ContainerClient.from_connection_string(self.emulator.connection_string,
                                                      self.container)

    @property
    def queue(self) -> Any:
        from azure.storage.queue import QueueClient

        return QueueClient.from_connection_string(self.emulator.connection_string,
                                                  self.queue_name)

    def sequencer(self) -> str:
        with self._lock:
            return f"{next(self._counter):032X}"

    def put(self, name: str, data: bytes, *, deliver: bool = True) -> str:
        """Upload a blob; returns the message of its BlobCreated event (sent unless
        `deliver=False`, to be sent later with `send`)."""
        blob = self.blobs.get_blob_client(name)
        blob.upload_blob(data, overwrite=True)
        props = blob.get_blob_properties()
        message = event_message("BlobCreated", self.container, name,
                                sequencer=self.sequencer(), etag=props.etag, size=props.size,
                                when=props.last_modified, schema=self.schema)
        if deliver:
            self.send(message)
        return message

    def delete(self, name: str, *, deliver: bool = True) -> str:
        self.blobs.delete_blob(name)
        message = event_message("BlobDeleted", self.container, name,
                                sequencer=self.sequencer(), schema=self.schema)
        if deliver:
            self.send(message)
        return message

    def send(self, message: str) -> None:
        self.queue.send_message(message)

    def counts(self) -> tuple[int, int]:
        """(visible + invisible messages, poison messages) as the service counts them."""
        from azure.storage.queue import QueueClient

        main = self.queue.get_queue_properties().approximate_message_count
        poison = QueueClient.from_connection_string(self.emulator.connection_string,
                                                    f"{self.queue_name}-poison")
        try:
            bad = poison.get_queue_properties().approximate_message_count
        except Exception:  # noqa: BLE001 - not created yet
            bad = 0
        return main, bad


def make_rig(emulator: Azurite, schema: str = "eventgrid") -> AzureRig:
    from azure.storage.blob import BlobServiceClient
    from azure.storage.queue import QueueServiceClient

    suffix = uuid.uuid4().hex[:10]
    rig = AzureRig(emulator, f"c{suffix}", f"q{suffix}", schema)
    BlobServiceClient.from_connection_string(emulator.connection_string).create_container(
        rig.container)
    QueueServiceClient.from_connection_string(emulator.connection_string).create_queue(
        rig.queue_name)
    return rig


@pytest.fixture
def azure_rig(azure_env: Azurite) -> AzureRig:
    """A fresh container and queue on Azurite, with the environment pointing at it."""
    return make_rig(azure_env)




@pytest.fixture
def azure_executors(spark, azure_env: Azurite, monkeypatch: pytest.MonkeyPatch):
    """The session's Spark with `azure_env` on its executors too (`spark.executorEnv.*`: its
    Python workers keep the environment the JVM started with), as a cluster's executors get
    theirs from their identity or image; yields the session."""
    monkeypatch.setitem(spark.sparkContext.environment, "AZURE_STORAGE_CONNECTION_STRING",
                        azure_env.connection_string)
    return spark
