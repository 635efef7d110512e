"""A warehouse on S3 (moto's server in its own process): the whole state lives in the bucket,
a second process sees it, nothing touches local disk, secrets are never written, and the
refusal cases (no bucket, bad credentials, no conditional writes, oss://) fail cleanly."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

import volume_stream as vs
from connectors.events import FileEvent
from tests.fakes.strip_proxy import StripProxy
from tests.s3_warehouse_fixtures import child_env, s3_client
from volume_stream.errors import ConfigError, WarehouseError

ROOT = Path(__file__).resolve().parents[2]


def keys(endpoint: str, bucket: str) -> list[str]:
    out = s3_client(endpoint).list_objects_v2(Bucket=bucket).get("Contents", [])
    return sorted(o["Key"] for o in out)


def local_tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current folder: a `Path("s3://...")` leaking to local disk would land here."""
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    return here


def test_s3_warehouse_end_to_end(s3_env, s3_bucket, cwd, tmp_path, spark):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a.txt", "b.txt"):
        (data / name).write_text(name)
    uri = f"s3://{s3_bucket}/wh"
    cat = vs.connect(uri, spark=spark)
    assert repr(cat) == f"Catalog({uri!r})"
    cat.create_volume("landing", str(data))
    cat.create_stream("s", on_volume="landing")
    assert cat.refresh("landing").inserted == 2
    assert cat.describe_volume("landing")["table_path"].startswith(f"{uri}/volumes/landing-")
    with cat.consume("s") as batch:
        assert sorted(batch.df.select("relative_path").toPandas()["relative_path"]) == \
            ["a.txt", "b.txt"]
    assert cat.describe_stream("s")["offset"] == 1
    stored = keys(s3_env, s3_bucket)
    assert "wh/volume-stream.json" in stored
    assert any(k.startswith("wh/_catalog/_delta_log/") for k in stored)
    assert any(k.startswith("wh/volumes/landing-") and "/directory/_delta_log/" in k
               for k in stored)
    assert not any(k.startswith("wh/_probe/") for k in stored)  # the probe cleans up
    # a second process sees the same state
    code = (f"import json, volume_stream as vs; c = vs.connect({uri!r}); "
            "print(json.dumps([c.describe_stream('s')['offset'], c.list_volumes()[0]['files']]))")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(s3_env), cwd=cwd,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [1, 2]
    assert local_tree(cwd) == []  # nothing was written to local disk


def test_storage_options_reach_delta_rs_and_are_never_written(s3_env, s3_bucket, cwd,
                                                              monkeypatch):
    # no endpoint nor credentials in the environment: only what storage_options carry
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    secret = "testing-secret-visible-nowhere"
    options = {"AWS_ENDPOINT_URL": s3_env, "AWS_ALLOW_HTTP": "true",
               "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": secret,
               "AWS_REGION": "us-east-1"}
    uri = f"s3://{s3_bucket}/wh2"
    cat = vs.connect(uri, storage_options=options)
    cat.create_volume("v", str(cwd.parent))
    table = cat.directory_table("v")
    table.apply([FileEvent.created("x.bin", size=1, last_modified_time=datetime.now(UTC))])
    cat.create_stream("s", on_volume="v")
    assert vs.connect(uri, storage_options=options).describe_stream("s")["offset"] == 1
    s3 = s3_client(s3_env)
    for key in keys(s3_env, s3_bucket):
        body = s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
        assert secret.encode() not in body, key
    assert secret not in repr(cat) and secret not in repr(cat.warehouse)
    assert local_tree(cwd) == []


def test_missing_bucket_is_a_warehouse_error_naming_the_uri(s3_env, cwd):
    uri = "s3://no-such-bucket-volume-stream/wh"
    with pytest.raises(WarehouseError, match="s3://no-such-bucket-volume-stream/wh"):
        vs.connect(uri)
    assert local_tree(cwd) == []


def test_bad_credentials_are_a_config_error_and_nothing_is_created(s3_env, s3_bucket, cwd):
    with StripProxy(s3_env, allowed_key="the-right-key").start() as proxy:
        with pytest.raises(ConfigError, match=f"s3://{s3_bucket}/wh") as info:
            vs.connect(f"s3://{s3_bucket}/wh", storage_options={
                "AWS_ENDPOINT_URL": proxy.endpoint, "AWS_ACCESS_KEY_ID": "a-wrong-key",
                "AWS_SECRET_ACCESS_KEY": "wrong"})
    assert "credentials were refused" in str(info.value)
    assert "wrong" not in str(info.value).replace("a-wrong-key", "")  # no secret echoed
    assert keys(s3_env, s3_bucket) == []
    assert local_tree(cwd) == []


def test_a_store_ignoring_if_none_match_is_refused(s3_env, s3_bucket, cwd):
    with StripProxy(s3_env, strip=("If-None-Match",)).start() as proxy:
        with pytest.raises(WarehouseError, match="conditional writes") as info:
            vs.connect(f"s3://{s3_bucket}/wh", storage_options={
                "AWS_ENDPOINT_URL": proxy.endpoint})
    assert f"s3://{s3_bucket}/wh" in str(info.value)
    assert keys(s3_env, s3_bucket) == []  # nothing half-created, the probe cleaned up
    assert local_tree(cwd) == []


def test_oss_warehouse_is_refused_with_the_reason(cwd):
    with pytest.raises(ConfigError, match="oss://bucket/wh.*x-oss-forbid-overwrite.*S3, HDFS"):
        vs.connect("oss://bucket/wh")
    assert local_tree(cwd) == []


def test_a_foreign_prefix_is_refused(s3_env, s3_bucket, cwd):
    s3_client(s3_env).put_object(Bucket=s3_bucket, Key="data/report.csv", Body=b"x")
    with pytest.raises(WarehouseError, match="report.csv.*Nothing was changed"):
        vs.connect(f"s3://{s3_bucket}/data")
    assert keys(s3_env, s3_bucket) == ["data/report.csv"]


def test_file_uri_and_path_open_the_same_warehouse(tmp_path):
    first = vs.connect(tmp_path / "wh")
    first.create_volume("v", str(tmp_path))
    again = vs.connect(f"file://{tmp_path}/wh")
    assert [v["name"] for v in again.list_volumes()] == ["v"]
    assert isinstance(again.warehouse.root, Path)
