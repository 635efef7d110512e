"""The recipes in examples/: image metadata on images made with Pillow (a JPEG with EXIF, a
PNG, a truncated JPEG, a file that is no image), log ingestion on generated logs with good and
garbled lines; and each recipe script run end to end in its self-contained mode."""

from __future__ import annotations

import gzip
import importlib.util
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pytest
from deltalake import DeltaTable
from PIL import Image

import volume_stream as vs
from volume_stream.cli.jobs import load_udf

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture
def catalog(tmp_path, spark):
    return vs.connect(tmp_path / "warehouse", spark=spark)


def rows_of(uri: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in DeltaTable(uri).to_pyarrow_table().to_pylist():
        out.setdefault(row["relative_path"], []).append(row)
    return out


def make_images(folder: Path) -> None:
    folder.mkdir()
    exif = Image.Exif()
    exif[0x010F], exif[0x0110] = "NIKON CORPORATION", "NIKON D750"
    exif.get_ifd(0x8769)[0x9003] = "2023:12:24 18:05:09"
    exif.get_ifd(0x8769)[0x9011] = "-05:00"
    Image.new("RGB", (320, 200), "green").save(folder / "holiday.jpg", exif=exif)
    (folder / "sub").mkdir()
    Image.new("L", (10, 30), 128).save(folder / "sub" / "plain.JPG")
    Image.new("RGBA", (64, 48), (1, 2, 3, 4)).save(folder / "logo.png")
    noisy = Image.effect_noise((300, 300), 80).convert("RGB")
    noisy.save(folder / "whole.jpg", quality=95)
    data = (folder / "whole.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(data[: len(data) // 3])
    (folder / "fake.jpg").write_text("not an image at all")
    (folder / "notes.txt").write_text("skipped by the glob")


def test_image_metadata_recipe(catalog, tmp_path):
    make_images(tmp_path / "images")
    catalog.create_volume("images", tmp_path / "images")
    catalog.create_stream("new_images", on_volume="images")
    catalog.refresh("images")
    recipe = load_udf("examples/image_metadata.py:image_metadata", ROOT)
    sys.path.insert(0, str(EXAMPLES))
    try:
        from image_metadata import IMAGE_GLOBS
    finally:
        sys.path.remove(str(EXAMPLES))
    pipeline = catalog.pipeline("new_images", recipe, "image_meta", path_glob=IMAGE_GLOBS)
    m = pipeline.run_once()
    assert (m.files_seen, m.files_ok, m.files_failed) == (6, 4, 2)
    rows = {p: r[0] for p, r in rows_of(pipeline.target_uri).items()}
    assert set(rows) == {"holiday.jpg", "sub/plain.JPG", "logo.png", "whole.jpg"}
    holiday = rows["holiday.jpg"]
    assert (holiday["format"], holiday["width"], holiday["height"], holiday["mode"]) == (
        "JPEG", 320, 200, "RGB")
    assert (holiday["camera_make"], holiday["camera_model"]) == ("NIKON CORPORATION",
                                                                 "NIKON D750")
    assert holiday["taken_at"] == datetime(2023, 12, 24, 23, 5, 9, tzinfo=UTC)  # -05:00 -> UTC
    plain = rows["sub/plain.JPG"]
    assert (plain["mode"], plain["width"], plain["taken_at"], plain["camera_make"]) == (
        "L", 10, None, None)
    assert (rows["logo.png"]["format"], rows["logo.png"]["mode"]) == ("PNG", "RGBA")
    errors = {p: r[0] for p, r in rows_of(pipeline.errors_uri).items()}
    assert set(errors) == {"truncated.jpg", "fake.jpg"}
    assert "truncated" in errors["truncated.jpg"]["error"]
    assert errors["fake.jpg"]["error_type"] == "PIL.UnidentifiedImageError"


ACCESS_LOG = (
    '127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 2326 '
    '"http://www.example.com/start.html" "Mozilla/4.08 [en] (Win98; I ;Nav)"\n'
    '10.0.0.1 - - [10/Oct/2000:13:55:37 +0000] "HEAD /health HTTP/1.1" 204 -\n'
    'GARBLED ][ "" line with no structure\n'
    '\n'
    '::1 - - [31/Dec/2024:23:59:59 +0100] "GET /a%20b?q=1 HTTP/2.0" 404 17 "-" "curl/8.5.0"\n'
)
JSON_LOG = (
    '{"ts": "2024-06-01T12:00:00+02:00", "level": "INFO", "msg": "ok", "user": "ann"}\n'
    '{"timestamp": 1717243200, "severity": "ERROR", "message": "boom"}\n'
    '{"ts": "2024-06-01T12:00:02Z", "msg": "cut off\n'
    '[1, 2, 3]\n'
)


def test_log_ingestion_recipe(catalog, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "access.log").write_text(ACCESS_LOG)
    (logs / "app.jsonl").write_text(JSON_LOG)
    with gzip.open(logs / "old.log.gz", "wt") as f:
        f.write('{"ts": "2024-01-01T00:00:00Z", "level": "WARN", "msg": "zipped"}\n')
    (logs / "broken.log.gz").write_bytes(b"\x1f\x8b\x08\x00 definitely not gzip")
    catalog.create_volume("logs", logs)
    catalog.create_stream("log_files", on_volume="logs", show_initial_rows=True)
    catalog.refresh("logs")
    recipe = load_udf("examples/log_ingestion.py:log_lines", ROOT)
    pipeline = catalog.pipeline("log_files", recipe, "log_lines",
                                path_glob=["*.log", "*.jsonl", "*.gz"])
    m = pipeline.run_once()
    assert (m.files_ok, m.files_failed, m.rows_written) == (3, 1, 9)
    rows = rows_of(pipeline.target_uri)
    access = sorted(rows["access.log"], key=lambda r: r["line_no"])
    assert [(r["line_no"], r["format"]) for r in access] == [
        (1, "combined"), (2, "common"), (3, "unparsed"), (5, "combined")]
    first = access[0]
    assert (first["client_ip"], first["user"], first["method"], first["path"], first["status"],
            first["bytes"], first["referer"]) == ("127.0.0.1", "frank", "GET", "/apache_pb.gif",
                                                  200, 2326, "http://www.example.com/start.html")
    assert first["ts"] == datetime(2000, 10, 10, 20, 55, 36, tzinfo=UTC)
    assert (access[1]["bytes"], access[1]["user_agent"]) == (None, None)
    assert access[2]["raw"] == 'GARBLED ][ "" line with no structure'
    assert access[2]["parse_error"]
    assert (access[3]["referer"], access[3]["user_agent"]) == (None, "curl/8.5.0")
    app = sorted(rows["app.jsonl"], key=lambda r: r["line_no"])
    assert [r["format"] for r in app] == ["json", "json", "unparsed", "unparsed"]
    assert (app[0]["ts"], app[0]["level"], app[0]["message"], app[0]["attributes"]) == (
        datetime(2024, 6, 1, 10, 0, tzinfo=UTC), "INFO", "ok", '{"user": "ann"}')
    assert (app[1]["ts"], app[1]["level"]) == (datetime(2024, 6, 1, 12, 0, tzinfo=UTC), "ERROR")
    assert [r["message"] for r in rows["old.log.gz"]] == ["zipped"]
    (error,) = DeltaTable(pipeline.errors_uri).to_pyarrow_table().to_pylist()
    assert error["relative_path"] == "broken.log.gz"


@pytest.mark.parametrize("recipe, expected", [
    ("image_metadata", ["'files_ok': 2", "'files_failed': 1", "Canon", "EOS 5D",
                        "2024-05-01 08:30:00", "broken.jpg", "image file is truncated"]),
    ("log_ingestion", ["'files_ok': 3", "combined", "unparsed", "db down", "disk 91%"]),
])
def test_recipe_scripts_run_self_contained(spark, tmp_path, monkeypatch, capsys, recipe,
                                           expected):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sys, "argv", [f"{recipe}.py"])
    spec = importlib.util.spec_from_file_location(f"_recipe_{recipe}", EXAMPLES / f"{recipe}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        module.main()
    finally:
        del sys.modules[spec.name]
    out = capsys.readouterr().out
    for needle in expected:
        assert needle in out, out


@pytest.mark.slow  # a recipe's full run in a real process: make soak
def test_a_recipe_leaves_no_sample_folder_behind(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    script = str(EXAMPLES / "log_ingestion.py")
    done = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "removed at exit" in done.stdout
    assert not list(tmp_path.glob("vs-log-ingestion-*"))  # (--keep skips the removal)
