"""RAM roles for OSS/MNS volumes: Alibaba Cloud STS `AssumeRole` (RPC style, HMAC-SHA1) against
the local STS fake, whose temporary credentials the OSS and MNS fakes accept only with their
security token. The process's own key is known to STS alone, so OSS and MNS are reachable only
through the role. Expiry mid-run: a `role_refresh_seconds` close to the duration makes the
connectors assume the role again within seconds; the fake then expires the old credentials."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import pickle
import time
from urllib.parse import parse_qsl, urlsplit

import oss2
import pytest

import volume_stream as vs
from connectors.alicloud.listener import MnsListener
from connectors.alicloud.store import OssReader
from connectors.alicloud.sts import AliRole, sign_rpc
from connectors.errors import ConnectorError, CredentialsError
from tests.alicloud_fixtures import (  # noqa: F401
    FAKE_ACCESS_KEY_ID,
    FAKE_ACCESS_KEY_SECRET,
    make_volume,
    mns_server,
    oss_server,
)
from tests.fakes.sts_server import FakeStsServer, rpc_signature

ROLE = "acs:ram::1450476637304722:role/volume-stream-reader"
BASE_ID, BASE_SECRET = "LTAI5tOnlyStsKnowsThisKey", "base-secret-visible-nowhere"


@pytest.fixture
def sts(mns_server, oss_server):
    server = FakeStsServer({BASE_ID: BASE_SECRET}, grants={ROLE: {BASE_ID}},
                           issue_to=[oss_server.backend, mns_server.backend]).start()
    yield server
    server.stop()


@pytest.fixture
def base_env(monkeypatch):
    """The process's own credentials: a key only STS accepts."""
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", BASE_ID)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", BASE_SECRET)
    monkeypatch.delenv("ALIBABA_CLOUD_SECURITY_TOKEN", raising=False)


@pytest.fixture
def vol(mns_server, oss_server):
    volume = make_volume(mns_server, oss_server, prefix="in/", visibility_timeout=5)
    yield volume
    volume.close()


def role_options(sts, **extra) -> dict:
    return {"role_arn": ROLE, "sts_endpoint": sts.endpoint, **extra}


def test_our_signature_is_aliyunsdkcores(sts):
    from aliyunsdkcore.auth.composer import rpc_signature_composer as composer

    params = {"Action": "AssumeRole", "RoleArn": ROLE, "RoleSessionName": "a b*c~d/é",
              "DurationSeconds": "900", "Version": "2015-04-01"}
    url, _ = composer.get_signed_url(dict(params), BASE_ID, BASE_SECRET, "JSON", "POST", {})
    signed = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))
    expected = signed.pop("Signature")
    assert sign_rpc("POST", signed, BASE_SECRET) == expected  # the connector's
    assert rpc_signature("POST", signed, BASE_SECRET) == expected  # the fake's


def test_role_credentials_sign_oss_and_mns_and_are_refreshed(sts, base_env, vol):
    vol.oss.put_object("in/a.txt", b"hello")
    plain = OssReader(vol.bucket, vol.prefix, vol.oss_endpoint)
    with pytest.raises(CredentialsError):  # the base key alone is refused by OSS
        plain.read_range("a.txt", 0, 100)
    reader = OssReader(vol.bucket, vol.prefix, vol.oss_endpoint, **role_options(
        sts, role_duration_seconds=900, role_refresh_seconds=897))
    assert reader.read_range("a.txt", 0, 100) == b"hello"
    first = sts.issued[-1]
    assert first.startswith("STS.")
    # an executor gets the role, never the credentials, and assumes it itself
    shipped = pickle.loads(pickle.dumps(reader))
    assert first.encode() not in pickle.dumps(reader)
    assert shipped.read_range("a.txt", 0, 100) == b"hello" and sts.issued[-1] != first
    # keep reading until the threshold is crossed and the role is assumed again
    deadline = time.monotonic() + 60
    while sts.issued.count(first) == 1 and reader._role._cached.access_key_id == first:
        assert time.monotonic() < deadline, "the role was never assumed again"
        reader.read_range("a.txt", 0, 100)
    sts.expire(first)  # the old credentials no longer work
    assert reader.read_range("a.txt", 0, 100) == b"hello"
    # MNS: the listener receives with the role's credentials, across a refresh too
    listener = MnsListener(vol.mns_endpoint, vol.queue_name, bucket=vol.bucket, prefix="in/",
                           wait_seconds=0, **role_options(sts, role_duration_seconds=900,
                                                          role_refresh_seconds=897))
    try:
        batch = listener.receive(timeout=10)
        assert [e.relative_path for e in batch.events] == ["a.txt"]
        key = listener._role._cached.access_key_id
        while listener._role._cached.access_key_id == key:
            assert time.monotonic() < deadline + 60
            listener._role.credentials()
            time.sleep(0.2)
        sts.expire(key)
        listener.ack(batch.handles)
        vol.oss.put_object("in/b.txt", b"b")
        batch = listener.receive(timeout=10)
        assert [e.relative_path for e in batch.events] == ["b.txt"]
        listener.ack(batch.handles)
    finally:
        listener.close()


def test_a_volume_with_role_arn_end_to_end(sts, base_env, vol, tmp_path):
    cat = vs.connect(tmp_path / "wh")
    vol.oss.put_object("in/old.txt", b"o")
    cat.create_volume("v", f"oss://{vol.bucket}/in/", endpoint=vol.oss_endpoint,
                      notification=vs.MnsNotification(vol.mns_endpoint, vol.queue_name,
                                                      wait_seconds=0),
                      **role_options(sts))
    assert cat.volume_spec("v").options["role_arn"] == ROLE  # stored: not a secret
    assert cat.refresh("v").inserted == 1
    vol.oss.put_object("in/new.txt", b"n")
    cat.watch("v", until_idle=True, timeout=60, refresh=False)
    snap = cat.directory_table("v").snapshot(columns=["relative_path"])
    assert sorted(snap["relative_path"].to_pylist()) == ["new.txt", "old.txt"]
    assert BASE_SECRET not in str(cat.describe_volume("v"))


def test_sql_connection_role_arn_is_assumed(sts, base_env, vol, tmp_path):
    cat = vs.connect(tmp_path / "wh")
    vol.oss.put_object("in/x.txt", b"x")
    cat.sql(f"CREATE STORAGE CONNECTION c TYPE OSS ENDPOINT = '{vol.oss_endpoint}' "
            f"ROLE_ARN = '{ROLE}'")
    cat.sql(f"CREATE EXTERNAL VOLUME v LOCATION 'oss://{vol.bucket}/in/' USING CONNECTION c "
            f"NOTIFICATION = (QUEUE_TYPE = 'ALICLOUD_MNS', QUEUE_NAME = '{vol.queue_name}', "
            f"ENDPOINT = '{vol.mns_endpoint}')")
    spec = cat.volume_spec("v")
    assert spec.options["role_arn"] == ROLE  # the connection's role reaches the connectors
    # the default STS endpoint (https://sts.aliyuncs.com) is not reachable from here: point a
    # copy of the volume at the fake, as a deployment may point at its region's STS endpoint
    cat.create_volume("v2", spec.location, **{**spec.options, "sts_endpoint": sts.endpoint})
    assert cat.refresh("v2").inserted == 1


def test_refusals_name_the_role_and_show_no_secret(sts, base_env, vol):
    with pytest.raises(ConnectorError, match="not a RAM role ARN"):
        OssReader(vol.bucket, "", vol.oss_endpoint, role_arn="arn:aws:iam::1:role/x")
    with pytest.raises(ConnectorError, match="between 900 and 43200"):
        AliRole.of(None, ROLE, role_duration_seconds=60)
    other = "acs:ram::1450476637304722:role/not-granted"
    with pytest.raises(CredentialsError, match="NoPermission") as info:
        OssReader(vol.bucket, "", vol.oss_endpoint, role_arn=other,
                  sts_endpoint=sts.endpoint).read_range("a.txt", 0, 10)
    assert other in str(info.value) and BASE_SECRET not in str(info.value)
    with pytest.raises(CredentialsError, match="SignatureDoesNotMatch"):
        AliRole.of(AliCloudOptionsFor(BASE_ID, "wrong"), ROLE,
                   sts_endpoint=sts.endpoint).credentials()
    # expired credentials that cannot be refreshed: STS now refuses the base key
    role = AliRole.of(AliCloudOptionsFor(BASE_ID, BASE_SECRET), ROLE, sts_endpoint=sts.endpoint,
                      role_duration_seconds=900, role_refresh_seconds=899)
    first = role.credentials()
    sts.grants[ROLE] = set()
    sts.expire(first.access_key_id)
    deadline = time.monotonic() + 10
    while not role.needs_refresh():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(CredentialsError, match=f"{ROLE}.*NoPermission"):
        role.credentials()


def AliCloudOptionsFor(key: str, secret: str):  # noqa: N802 - reads like the class it makes
    from connectors.alicloud.client import AliCloudOptions

    return AliCloudOptions(key, secret)


def test_oss2_refuses_a_token_the_fake_did_not_issue(sts, vol):
    role = AliRole.of(AliCloudOptionsFor(BASE_ID, BASE_SECRET), ROLE, sts_endpoint=sts.endpoint)
    creds = role.credentials()
    bad = oss2.Bucket(oss2.StsAuth(creds.access_key_id, creds.access_key_secret, "forged"),
                      vol.oss_endpoint, vol.bucket)
    with pytest.raises(oss2.exceptions.AccessDenied):
        bad.put_object("in/x", b"x")
