"""Bad input reaches the caller as a VolumeStreamError naming the object, never as a raw
Python error or a traceback (issue 16: defects 5-8). No Spark: these fail before it is needed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import volume_stream as vs
from volume_stream.config import DaemonConfig

CLI = str(Path(sys.executable).parent / "volume-stream")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=180)


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "wh")  # Spark is started lazily; none of these need it


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "a.txt").write_text("a")
    return d


# ------------------------------------------------------------------ defect 5: raw errors
def test_refresh_of_a_vanished_folder_is_a_source_error(cat, data):
    cat.create_volume("v", data)
    shutil.rmtree(data)
    with pytest.raises(vs.VolumeStreamError, match="volume 'v'") as info:
        cat.refresh("v")
    assert isinstance(info.value.__cause__, FileNotFoundError)


@pytest.mark.parametrize("when", ["yesterday", 12345, "2026-13-45"])
def test_create_stream_with_a_bad_timestamp_is_invalid_input(cat, data, when):
    cat.create_volume("v", data)
    with pytest.raises(vs.InvalidInputError, match="at_timestamp"):
        cat.create_stream("s", "v", at_timestamp=when)
    assert cat.list_streams() == []


@pytest.mark.parametrize("include", [5, [1, 2], {"a": 1}])
def test_include_that_is_not_globs_is_refused_at_creation(cat, data, include):
    with pytest.raises(vs.InvalidInputError, match="include must be a glob"):
        cat.create_volume("v", data, include=include)
    assert cat.list_volumes() == []


def test_connect_where_no_folder_can_be_made_is_a_warehouse_error(tmp_path):
    with pytest.raises(vs.WarehouseError, match="/proc/forbidden/wh"):
        vs.connect("/proc/forbidden/wh")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(vs.WarehouseError):
        vs.connect(blocker / "wh")


def test_config_check_of_a_non_utf8_file_is_one_error_line(tmp_path):
    bad = tmp_path / "vs.toml"
    bad.write_bytes(b'warehouse = "\xff\xfe/wh"\n')
    with pytest.raises(vs.ConfigError, match="not UTF-8"):
        DaemonConfig.load(bad)
    proc = cli("config", "check", str(bad))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "not UTF-8" in proc.stderr


def test_cli_errors_have_no_traceback(tmp_path, data):
    proc = cli("volume", "list", "--warehouse", "/proc/forbidden/wh")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "error:" in proc.stderr and "/proc/forbidden/wh" in proc.stderr
    wh = str(tmp_path / "wh")
    assert cli("volume", "create", "v", str(data), "--warehouse", wh).returncode == 0
    shutil.rmtree(data)
    proc = cli("volume", "refresh", "v", "--warehouse", wh)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "volume 'v'" in proc.stderr


# ------------------------------------------------------------------ defect 7: unknown options
def test_misspelled_options_are_refused_with_close_matches(cat, data):
    with pytest.raises(vs.InvalidInputError, match=r"'exlude' \(did you mean 'exclude'") as info:
        cat.create_volume("v", data, exlude=["*.tmp"])
    assert "include" in str(info.value)  # the known options are listed
    with pytest.raises(vs.InvalidInputError, match="'colour'"):
        cat.create_volume("v", data, colour="blue")
    assert cat.list_volumes() == []
    cat.create_volume("v", data, exclude=["*.tmp"], include="*.txt", data_retention_days=1)


def test_s3_volumes_know_the_client_options(cat):
    with pytest.raises(vs.InvalidInputError, match="did you mean 'region_name'"):
        cat.create_volume("v", "s3://bucket/p/", regon_name="eu-west-1")
    cat.create_volume("v", "s3://bucket/p/", region_name="eu-west-1",
                      endpoint_url="http://127.0.0.1:1")


# ------------------------------------------------------------------ defect 6: one validation
@pytest.mark.parametrize(("volume", "stream"), [("x'; drop", "s"), ("landing", "s; DROP")])
def test_config_check_refuses_names_the_daemon_refuses(tmp_path, volume, stream):
    path = tmp_path / "vs.toml"
    path.write_text(f'warehouse = "{tmp_path / "wh"}"\n'
                    f'[volumes."{volume}"]\nlocation = "{tmp_path}"\n'
                    f'[volumes."{volume}".streams."{stream}"]\n')
    with pytest.raises(vs.ConfigError, match="invalid (volume|stream) name"):
        DaemonConfig.load(path)
    proc = cli("config", "check", str(path))
    assert proc.returncode != 0 and "invalid" in proc.stderr and "Traceback" not in proc.stderr


def test_config_check_refuses_unknown_volume_options(tmp_path):
    path = tmp_path / "vs.toml"
    path.write_text(f'warehouse = "{tmp_path / "wh"}"\n'
                    f'[volumes.landing]\nlocation = "{tmp_path}"\n'
                    f'options = {{ colour = "blue" }}\n')
    with pytest.raises(vs.ConfigError, match="colour"):
        DaemonConfig.load(path)


def test_sql_analysis_errors_print_one_line_not_sparks_log(tmp_path):
    vs.connect(tmp_path / "wh")  # SELECT only reads: it needs a warehouse
    proc = cli("sql", "-e", "SELECT * FROM nosuch", "--warehouse", str(tmp_path / "wh"))
    assert proc.returncode == 1
    assert "table 'nosuch' does not exist" in proc.stderr
    assert "SQLQueryContextLogger" not in proc.stderr and "\tat org.apache" not in proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ defect 8
def test_unsafe_names_skipped_by_refresh_are_counted(cat, data):
    (data / "back\\slash.txt").write_text("x")
    (data / "new\nline.txt").write_text("x")
    (data / "ok.txt").write_text("x")
    cat.create_volume("v", data)
    m = cat.refresh("v")
    assert (m.inserted, m.invalid_paths) == (2, 2)  # a.txt and ok.txt; the two unsafe names
    assert cat.refresh("v").invalid_paths == 2  # counted again, not committed


def test_misspelled_create_is_a_syntax_error_at_line_and_column(spark, tmp_path, data):
    cat = vs.connect(tmp_path / "wh", spark=spark)
    cat.create_volume("v", data)
    cat.create_stream("s", "v")
    with pytest.raises(vs.SqlSyntaxError) as info:
        cat.sql("SHOW STREAMS;\nCREATE STREM s ON VOLUME v")
    assert (info.value.line, info.value.column) == (2, 8)
    assert "STREM" in str(info.value)


def test_pipeline_target_cannot_climb_out_of_the_tables_folder(cat, data):
    cat.create_volume("v", data)
    cat.create_stream("s", "v")

    @vs.file_udf("n int")
    def f(file):
        return {"n": 1}

    for bad in ("../escape", "x/../../escape", "./../escape"):
        with pytest.raises(vs.InvalidInputError, match="climbs out"):
            cat.pipeline("s", f, bad)
    p = cat.pipeline("s", f, "fine")
    assert p.target_uri == str(cat.warehouse.root / "tables" / "fine")
