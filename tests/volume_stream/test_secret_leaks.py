"""No credential leaks: a marker in every secret field (a volume's AWS keys and session token,
its SQS notification's, an OSS volume's access key and STS token, the warehouse's storage
options, the shard API's keys) appears in no repr, str or pickle of the objects holding them,
no log line written while creating volumes, refreshing them and failing, no error message, and
no file of the warehouse. moto's server and the OSS fake run over HTTP and check nothing but the
OSS signature, which the marker key must produce (so the secret really is used)."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import boto3
import oss2
import pytest

import volume_stream as vs
from tests.aws_fixtures import aws_env, moto_server  # noqa: F401
from tests.fakes.mns_server import FakeMnsServer
from tests.fakes.oss_server import FakeOssServer
from volume_stream.config.settings import Settings
from volume_stream.errors import VolumeStreamError
from volume_stream.serve.server import ShardApiServer
from volume_stream.volumes import SqsNotification, backend_for

MARKER = "SECRET-MARKER-1234"
AWS = {"aws_access_key_id": f"{MARKER}-akid", "aws_secret_access_key": f"{MARKER}-sak",
       "aws_session_token": f"{MARKER}-st"}
OSS_ID, OSS_SECRET = f"{MARKER}-oss-id", f"{MARKER}-oss-secret"
OSS = {"access_key_id": OSS_ID, "access_key_secret": OSS_SECRET,
       "security_token": f"{MARKER}-sts-token"}
STORAGE = {"aws_secret_access_key": f"{MARKER}-wh-sak", "aws_session_token": f"{MARKER}-wh-st"}


def shown(*objects) -> str:
    """Every repr, str and pickle of `objects`."""
    parts = []
    for o in objects:
        parts += [repr(o), str(o), pickle.dumps(o).decode("latin-1")]
    return "\n".join(parts)


def chain(exc: BaseException | None) -> str:
    """Every message and repr of an exception and its causes."""
    out = []
    while exc is not None:
        out += [str(exc), repr(exc)]
        exc = exc.__cause__ or exc.__context__
    return "\n".join(out)


@pytest.fixture(scope="module")
def oss_fakes():
    mns = FakeMnsServer({OSS_ID: OSS_SECRET}).start()
    oss = FakeOssServer(mns.backend, {OSS_ID: OSS_SECRET}).start()
    yield oss
    oss.stop()
    mns.stop()


@pytest.fixture
def logs():
    """Every log record at DEBUG of this project's loggers (INFO elsewhere), formatted."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(self.format(record))

    handler = Keep(logging.DEBUG)
    root, ours = logging.getLogger(), [logging.getLogger(n) for n in (
        "volume_stream", "connectors", "directory_table")]
    levels = [root.level] + [lg.level for lg in ours]
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for lg in ours:
        lg.setLevel(logging.DEBUG)
    yield lines
    root.removeHandler(handler)
    for lg, level in zip([root, *ours], levels, strict=True):
        lg.setLevel(level)


def test_no_secret_is_shown_logged_raised_or_written(aws_env, oss_fakes, tmp_path, logs):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="leaks")
    s3.put_object(Bucket="leaks", Key="in/a.txt", Body=b"a")
    oss2.Bucket(oss2.Auth(OSS_ID, OSS_SECRET), oss_fakes.endpoint, "leaks-oss").create_bucket()
    oss2.Bucket(oss2.Auth(OSS_ID, OSS_SECRET), oss_fakes.endpoint, "leaks-oss").put_object(
        "in/b.txt", b"b")
    cat = vs.connect(tmp_path / "wh", storage_options=STORAGE)
    note = SqsNotification("http://127.0.0.1:1/queue/none", **AWS)
    s3_spec = cat.create_volume("s3v", "s3://leaks/in/", notification=note, **AWS)
    oss_spec = cat.create_volume("ossv", "oss://leaks-oss/in/", endpoint=oss_fakes.endpoint,
                                 **OSS)
    assert cat.refresh("s3v").version == 1 and cat.refresh("ossv").version == 1  # keys used
    bad = cat.create_volume("bad", "oss://no-such-bucket/in/", endpoint=oss_fakes.endpoint,
                            **{**OSS, "access_key_secret": f"{MARKER}-wrong"})
    with pytest.raises(VolumeStreamError) as failure:
        cat.refresh("bad")
    server = ShardApiServer(cat, "127.0.0.1", 0, keys={"AKID": f"{MARKER}-api"})
    settings = Settings(warehouse=str(tmp_path / "wh"), storage_options=STORAGE)
    objects = [settings, s3_spec, oss_spec, bad, note, cat.volume_spec("s3v"), cat.warehouse.location,
               server.keys, backend_for(s3_spec).reader(s3_spec),
               backend_for(oss_spec).reader(oss_spec)]
    for obj in objects:
        assert MARKER not in shown(obj), type(obj)
    assert MARKER not in chain(failure.value)
    # the secrets still reach the SDKs (and only there)
    assert vs.connect(settings.warehouse, storage_options=settings.storage_options
                      ).warehouse.location.delta_options() == STORAGE
    assert logs and MARKER not in "\n".join(logs)
    for path in Path(tmp_path / "wh").rglob("*"):
        if path.is_file():
            assert MARKER.encode() not in path.read_bytes(), path
