"""Errors of the lower layers (connectors, directory_table, the OS) reach the public API as
VolumeStreamError subclasses naming the object, with the original as __cause__; the CLI prints
them without a traceback."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name
from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import volume_stream as vs
from connectors.errors import ConnectorError, CredentialsError
from directory_table import CommitConflict, TableMissing
from tests.aws_fixtures import aws_env, moto_server  # noqa: F401
from volume_stream.errors import (
    CommitConflictError,
    ConfigError,
    SourceError,
    VolumeStreamError,
    WarehouseError,
    converted,
)

CLI = str(Path(sys.executable).parent / "volume-stream")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize(("raised", "expected"), [
    (CredentialsError("no credentials"), ConfigError),
    (ConnectorError("NoSuchBucket"), SourceError),
    (TableMissing("no table at /x"), WarehouseError),
    (CommitConflict("lost the race"), CommitConflictError),
    (FileNotFoundError(2, "gone", "/data"), SourceError),
])
def test_converted_maps_each_lower_error_and_keeps_the_cause(raised, expected):
    with pytest.raises(expected, match="volume 'v'") as info:
        with converted("volume 'v'"):
            raise raised
    assert info.value.__cause__ is raised
    assert isinstance(info.value, VolumeStreamError)


def test_sql_errors_are_in_the_one_tree():
    assert issubclass(vs.SqlError, VolumeStreamError)
    assert issubclass(vs.SqlSyntaxError, vs.InvalidInputError)
    from volume_stream.sql import SqlError

    assert SqlError is vs.SqlError


def test_refresh_of_a_missing_bucket_is_a_source_error_in_python_and_the_cli(aws_env, tmp_path):
    wh = str(tmp_path / "wh")
    bucket = f"missing-{uuid.uuid4().hex[:12]}"
    cat = vs.connect(wh)
    cat.create_volume("gone", f"s3://{bucket}/in/")
    with pytest.raises(SourceError, match="gone") as info:
        cat.refresh("gone")
    assert isinstance(info.value.__cause__, ConnectorError)
    assert not isinstance(info.value.__cause__, CredentialsError)

    proc = cli("volume", "refresh", "gone", "--warehouse", wh)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "error:" in proc.stderr and "gone" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_refresh_of_a_removed_folder_is_a_source_error_without_traceback(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    wh = str(tmp_path / "wh")
    vs.connect(wh).create_volume("landing", data)
    shutil.rmtree(data)
    with pytest.raises(SourceError, match="landing"):
        vs.connect(wh).refresh("landing")
    proc = cli("volume", "refresh", "landing", "--warehouse", wh)
    assert proc.returncode == 1
    assert "error:" in proc.stderr and "landing" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
