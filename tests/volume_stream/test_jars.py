"""The s3a jars are fetched only where Spark uses s3a:// (issue 34): `make install` fetches the
delta group, `volume-stream jars fetch s3` the s3 one, and a Spark write to S3 without them is
a ConfigError naming that command. Every test points $VOLUME_STREAM_JARS at a temporary folder
(the shared virtual environment's jars are never touched); the fetch resolves through Spark's
own Ivy from a Maven repository made here, offline (file://)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from volume_stream import _jars
from volume_stream.errors import ConfigError
from volume_stream.pipelines.delta_target import spark_uri


@pytest.fixture
def jars(tmp_path, monkeypatch):
    folder = tmp_path / "jars"
    monkeypatch.setenv("VOLUME_STREAM_JARS", str(folder))
    return folder


def cli(*args, env):
    return subprocess.run([sys.executable, "-m", "volume_stream.cli", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_without_the_s3_jars_a_spark_path_on_s3_names_the_command(jars):
    assert _jars.class_path() == []
    with pytest.raises(ConfigError) as info:
        _jars.require("s3", "a Spark table on S3 (s3://b/t)")
    text = str(info.value)
    assert "volume-stream jars fetch s3" in text and "690 MB" in text and str(jars) in text
    with pytest.raises(ConfigError, match="jars fetch s3"):
        spark_uri("s3://bucket/wh/tables/t")
    assert spark_uri("/local/wh/tables/t") == "/local/wh/tables/t"   # no jars needed
    # a group fetched by hand (its COORDINATES and a jar) counts
    s3 = jars / "s3"
    s3.mkdir(parents=True)
    (s3 / "COORDINATES").write_text("\n".join(_jars.coordinates()["s3"]) + "\n")
    (s3 / "x.jar").write_bytes(b"PK")
    _jars.require("s3", "anything")
    assert spark_uri("s3://bucket/t") == "s3a://bucket/t"
    assert _jars.class_path() == [str(s3 / "x.jar")]
    # a stale one (another version) does not
    (s3 / "COORDINATES").write_text("org.apache.hadoop:hadoop-aws:0.0.1\n")
    with pytest.raises(ConfigError):
        _jars.require("s3", "anything")


def test_jars_status_and_a_bad_group_through_the_command(jars):
    env = {"VOLUME_STREAM_JARS": str(jars)}
    status = cli("jars", "status", env=env)
    assert status.returncode == 1
    assert "missing (`volume-stream jars fetch s3` fetches it)" in status.stdout
    bad = cli("jars", "fetch", "s4", env=env)
    assert bad.returncode == 1 and bad.stderr.startswith("error: unknown jar group 's4'")
    assert not (jars / "s4").exists()


def _maven_repo(root: Path, coordinate: str) -> None:
    """A Maven repository holding `group:artifact:version`: a POM without dependencies and a
    jar of one class Spark does not ship."""
    group, artifact, version = coordinate.split(":")
    folder = root.joinpath(*group.split("."), artifact, version)
    folder.mkdir(parents=True)
    (folder / f"{artifact}-{version}.pom").write_text(
        f"<project><modelVersion>4.0.0</modelVersion><groupId>{group}</groupId>"
        f"<artifactId>{artifact}</artifactId><version>{version}</version>"
        f"<packaging>jar</packaging></project>")
    with zipfile.ZipFile(folder / f"{artifact}-{version}.jar", "w") as jar:
        jar.writestr("org/example/vstest/Fake.class", b"\xca\xfe\xba\xbe")


def test_fetch_s3_resolves_into_the_jar_folder_once(jars, tmp_path):
    (coordinate,) = _jars.coordinates()["s3"]
    _maven_repo(tmp_path / "repo", coordinate)
    env = {"VOLUME_STREAM_JARS": str(jars),
           "VOLUME_STREAM_MAVEN_REPO": (tmp_path / "repo").as_uri()}
    first = cli("jars", "fetch", "s3", "--no-archive", env=env)
    assert first.returncode == 0, first.stderr
    artifact, version = coordinate.split(":")[1:]
    assert sorted(p.name for p in (jars / "s3").iterdir()) == [
        "COORDINATES", f"org.apache.hadoop_{artifact}-{version}.jar"]
    assert "s3: 1 jars" in first.stderr
    again = cli("jars", "fetch", "s3", env=env)
    assert again.returncode == 0 and "already in" in again.stderr
    status = cli("jars", "status", env=env)
    assert "s3: " in status.stdout and "1 jars" in status.stdout
    assert not (jars / _jars.ARCHIVE).exists()   # no archive to build again here
