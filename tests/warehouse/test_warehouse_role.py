"""A warehouse reached only through an assumed role (`role_arn` in its storage options): STS
`AssumeRole` on moto's server (own process), behind a proxy that refuses every S3 request not
signed with temporary credentials. moto honours `DurationSeconds` in the expiry it returns but
does not enforce it, so expiry is played by the proxy: once the credentials were refreshed (a
`role_refresh_seconds` threshold close to the duration makes that happen within seconds), the
old key is refused as expired, and the catalog, the directory tables, the SQL tables (delta-rs)
and the marker (boto3) must all be using the new one."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

import volume_stream as vs
from connectors.events import FileEvent
from directory_table.roles import RoleOptions
from tests.fakes.strip_proxy import RemoteProxy
from tests.s3_warehouse_fixtures import child_env
from volume_stream.config.daemon import DaemonConfig
from volume_stream.errors import ConfigError

ROLE = "arn:aws:iam::123456789012:role/volume-stream-warehouse"


def role_options(endpoint: str, **extra: str) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
            "role_arn": ROLE, **extra}


@pytest.fixture
def proxy(s3_env):
    # in its own process: delta-rs holds the GIL in some calls while it waits on HTTP
    with RemoteProxy(s3_env, allowed_key_prefix="ASIA") as proxy:
        yield proxy


def work(cat: vs.Catalog, i: int) -> None:
    """One of each kind of write: a catalog CAS, a directory-table commit, a SQL table insert."""
    cat.create_stream(f"s{i}", on_volume="v")
    cat.directory_table("v").apply([FileEvent.created(f"f{i}.txt", size=i + 1,
                                                      last_modified_time=datetime.now(UTC))])
    cat.tables.insert("t", pa.table({"i": [i]}))


def test_warehouse_through_an_assumed_role_with_refresh_mid_run(proxy, s3_bucket, tmp_path):
    uri = f"s3://{s3_bucket}/wh"
    options = role_options(proxy.endpoint, AWS_ROLE_SESSION_NAME="wh-test",
                           role_duration_seconds="900", role_refresh_seconds="897")
    # the environment's long-term keys alone are refused by the proxy
    with pytest.raises(ConfigError, match="credentials were refused"):
        vs.connect(uri, storage_options={"AWS_ENDPOINT_URL": proxy.endpoint})
    cat = vs.connect(uri, storage_options=options)
    live = cat.warehouse.location.storage_options
    assert isinstance(live, RoleOptions) and live.role_arn == ROLE
    first = live["AWS_ACCESS_KEY_ID"]
    assert first.startswith("ASIA")
    (tmp_path / "data").mkdir()
    cat.create_volume("v", str(tmp_path / "data"))
    cat.sql("CREATE TABLE t (i INT)")
    work(cat, 0)
    # keep working until the threshold is crossed and the role is assumed again
    deadline, i = time.monotonic() + 90, 1
    while live["AWS_ACCESS_KEY_ID"] == first:
        assert time.monotonic() < deadline, "the credentials were never refreshed"
        work(cat, i)
        i += 1
    proxy.refuse(first)  # the old credentials have now "expired"
    seen_before = len(proxy.seen())
    work(cat, i)
    cat.directory_table("v").snapshot()
    assert vs.connect(uri, storage_options=options).describe_stream(f"s{i}")["volume"] == "v"
    assert sorted(cat.tables.snapshot("t")["i"].to_pylist()) == list(range(i + 1))
    used = proxy.seen()[seen_before:]
    assert first not in {k for k, _ in used}
    agents = {agent for k, agent in used if k.startswith("ASIA")}
    assert "Boto3" in agents and agents - {"Boto3"}, agents  # boto3 and delta-rs both
    # nothing secret is stored in the warehouse, and the options never show the keys
    assert live["AWS_SECRET_ACCESS_KEY"] not in repr(cat) + repr(live)
    assert "AWS_SECRET_ACCESS_KEY" not in RoleOptions.__reduce__(live)[1][0]


def test_a_bad_role_arn_is_a_config_error_naming_it(s3_env, s3_bucket):
    with pytest.raises(ConfigError, match="not-a-role.*not an IAM role ARN"):
        vs.connect(f"s3://{s3_bucket}/wh",
                   storage_options={**role_options(s3_env), "role_arn": "not-a-role"})
    with pytest.raises(ConfigError, match="role_duration_seconds must be between 900"):
        vs.connect(f"s3://{s3_bucket}/wh", storage_options=role_options(
            s3_env, role_duration_seconds="60"))
    with pytest.raises(ConfigError, match="role_arn applies to s3:// locations only"):
        vs.connect(Path("/tmp/never-made-wh"), storage_options=role_options(s3_env))
    assert not Path("/tmp/never-made-wh").exists()


def test_sts_refusal_is_a_config_error_naming_the_role_and_no_secret(proxy, s3_bucket):
    proxy.refuse("testing")  # STS refuses the base credentials
    with pytest.raises(ConfigError) as info:
        vs.connect(f"s3://{s3_bucket}/wh", storage_options=role_options(proxy.endpoint))
    text = str(info.value)
    assert ROLE in text and f"s3://{s3_bucket}/wh" in text and "ExpiredToken" in text
    assert "testing-secret" not in text


def test_expired_credentials_that_cannot_be_refreshed(proxy, s3_bucket):
    uri = f"s3://{s3_bucket}/wh"
    cat = vs.connect(uri, storage_options=role_options(
        proxy.endpoint, role_duration_seconds="900", role_refresh_seconds="897"))
    live = cat.warehouse.location.storage_options
    proxy.refuse("testing")  # STS refuses the base credentials ...
    proxy.refuse(live["AWS_ACCESS_KEY_ID"])  # ... and the assumed ones have expired
    deadline = time.monotonic() + 30
    while not live.needs_refresh():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    with pytest.raises(ConfigError) as info:
        cat.create_stream("s", on_volume="nothing")
    assert ROLE in str(info.value) and uri in str(info.value)


def test_cli_and_daemon_config_take_a_role(proxy, s3_env, s3_bucket, tmp_path):
    uri = f"s3://{s3_bucket}/wh"
    options = role_options(proxy.endpoint)
    env = {**child_env(s3_env), "VOLUME_STREAM_STORAGE_OPTIONS": json.dumps(options)}
    (tmp_path / "data").mkdir()
    for args in (["volume", "create", "landing", str(tmp_path / "data")],
                 ["volume", "list", "--json"]):
        out = subprocess.run([sys.executable, "-m", "volume_stream.cli", *args,
                              "--warehouse", uri], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[0])["name"] == "landing"
    seen = {key for key, _ in proxy.seen()}
    # the base key signed the STS calls only (the proxy refuses it for S3)
    assert any(k.startswith("ASIA") for k in seen) and seen - {"testing"} == \
        {k for k in seen if k.startswith("ASIA")}
    bad = subprocess.run([sys.executable, "-m", "volume_stream.cli", "volume", "list",
                          "--warehouse", uri], capture_output=True, text=True, timeout=120,
                         env={**env, "VOLUME_STREAM_STORAGE_OPTIONS": json.dumps(
                             {**options, "role_arn": "arn:aws:iam::1:role/short-account"})})
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "short-account" in bad.stderr and uri in bad.stderr
    toml = tmp_path / "vs.toml"
    toml.write_text(f'warehouse = "{uri}"\n\n[storage_options]\n'
                    + "".join(f'{k} = "{v}"\n' for k, v in options.items())
                    + f'role_refresh_seconds = "300"\n\n[volumes.landing]\n'
                    f'location = "{tmp_path / "data"}"\n')
    cfg = DaemonConfig.load(toml)
    assert cfg.storage_options["role_arn"] == ROLE
    assert vs.connect(cfg.warehouse, storage_options=cfg.storage_options).list_volumes()[0][
        "name"] == "landing"
