"""Per-file UDF pipelines on local Spark over real files, with real Delta targets: rows and their
metadata, offsets, UDF errors isolated in the errors table, transient read errors retried,
filters, delete sync, chunked commits and resuming a half-committed batch."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from deltalake import DeltaTable

import volume_stream as vs
from volume_stream.errors import InvalidInputError, NotFoundError, VolumeStreamError
from volume_stream.pipelines.executor import (
    CorruptDataFileError,
    apply_udf,
    is_transient,
    verify_data_file,
    write_parquet,
)


@vs.file_udf("content string, n_bytes long")
def content(file: vs.FileRecord):
    data = file.read_bytes()
    return {"content": data.decode(), "n_bytes": len(data)}


@vs.file_udf("word string")
def words(file: vs.FileRecord):
    """Zero or more rows per file; files named bad* raise, weird* return a wrong type."""
    text = file.read_text()
    if file.name.startswith("bad"):
        raise ValueError(f"cannot parse {file.relative_path}")
    if file.name.startswith("weird"):
        return 42
    if file.name.startswith("extra"):
        return {"word": "x", "surprise": 1}
    return ({"word": w} for w in text.split())


def write(folder: Path, name: str, text: str) -> None:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def table(uri: str, sort: str = "relative_path") -> list[dict]:
    rows = DeltaTable(uri).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: (r[sort], str(r)))


def setup_stream(catalog, data_dir, files: dict[str, str], **stream_options) -> None:
    for name, text in files.items():
        write(data_dir, name, text)
    catalog.create_stream("s", on_volume="vol", **stream_options)
    catalog.refresh("vol")


def test_rows_carry_metadata_and_the_offset_moves(catalog, volume, data_dir):
    setup_stream(catalog, data_dir, {"a.txt": "alpha", "sub/b.txt": "beta!"})
    pipeline = catalog.pipeline("s", content, "out")
    m = pipeline.run_once()
    assert (m.files_seen, m.files_ok, m.files_failed, m.rows_written) == (2, 2, 0, 2)
    assert (m.start_version, m.end_version, m.batch_id, m.commits) == (0, 1, 0, 1)
    assert pipeline.target_uri == str(catalog.warehouse.root / "tables" / "out")
    rows = table(pipeline.target_uri)
    assert [(r["relative_path"], r["content"], r["n_bytes"], r["__change_type"],
             r["__commit_version"]) for r in rows] == [
        ("a.txt", "alpha", 5, "INSERT", 1), ("sub/b.txt", "beta!", 5, "INSERT", 1)]
    assert all(r["processed_at"] is not None for r in rows)
    assert DeltaTable(pipeline.target_uri).schema().to_arrow().names == [
        "relative_path", "content", "n_bytes", "__change_type", "__commit_version",
        "processed_at"]
    info = catalog.describe_stream("s")
    assert (info["offset"], info["batch_id"], info["pending_changes"]) == (1, 1, 0)
    again = pipeline.run_once()
    assert (again.files_seen, again.commits, again.start_version, again.end_version) == (
        0, 0, 1, 1)
    assert len(table(pipeline.target_uri)) == 2


def test_udf_errors_go_to_the_errors_table_and_the_rest_proceed(catalog, volume, data_dir):
    setup_stream(catalog, data_dir, {"good.txt": "one two", "bad.txt": "x", "weird.txt": "y",
                                     "extra.txt": "z", "empty.txt": ""})
    pipeline = catalog.pipeline("s", words, str(catalog.warehouse.root.parent / "t" / "words"))
    m = pipeline.run_once()
    assert (m.files_seen, m.files_ok, m.files_failed, m.rows_written) == (5, 2, 3, 2)
    assert [r["word"] for r in table(pipeline.target_uri)] == ["one", "two"]
    errors = {r["relative_path"]: r for r in table(pipeline.errors_uri)}
    assert pipeline.errors_uri.endswith("/t/words_errors")
    assert set(errors) == {"bad.txt", "weird.txt", "extra.txt"}
    bad = errors["bad.txt"]
    assert bad["error"] == "ValueError: cannot parse bad.txt"
    assert bad["error_type"] == "ValueError"
    assert "in words" in bad["traceback"] and "raise ValueError" in bad["traceback"]
    assert (bad["attempt"], bad["batch_id"], bad["__commit_version"]) == (1, 0, 1)
    assert "must return a dict" in errors["weird.txt"]["error"]
    assert "['surprise'] not in the UDF schema" in errors["extra.txt"]["error"]
    assert catalog.describe_stream("s")["offset"] == 1  # failed files do not hold the stream


def test_transient_read_errors_are_retried_with_backoff(catalog, volume, data_dir, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()

    @vs.file_udf("content string")
    def flaky(file):
        mark = marks / file.name
        if file.name.startswith("down") or not mark.exists():
            mark.touch()
            raise ConnectionResetError(104, "connection reset by peer")
        return {"content": file.read_text()}

    setup_stream(catalog, data_dir, {"a.txt": "A", "b.txt": "B", "down.txt": "D"})
    pipeline = catalog.pipeline("s", flaky, "out", max_attempts=3, retry_backoff_s=0.01)
    m = pipeline.run_once()
    assert (m.files_ok, m.files_failed) == (2, 1)
    assert [r["content"] for r in table(pipeline.target_uri)] == ["A", "B"]
    (err,) = table(pipeline.errors_uri)
    assert (err["relative_path"], err["attempt"]) == ("down.txt", 3)
    assert err["error_type"] == "ConnectionResetError"


def test_what_counts_as_transient():
    from connectors.errors import ConnectorError, ObjectNotFoundError, TransientError

    # one rule with the connectors: they classify SDK errors at the edge (SlowDown → TransientError)
    assert is_transient(TransientError("GetObject s3://b/k: SlowDown"))
    assert not is_transient(ConnectorError("GetObject s3://b/k: AccessDenied"))
    assert is_transient(TimeoutError())
    assert is_transient(OSError(5, "Input/output error"))
    assert not is_transient(ObjectNotFoundError("gone"))
    assert not is_transient(OSError("image file is truncated"))
    assert not is_transient(ValueError("bad"))
    try:
        try:
            raise ConnectionResetError()
        except ConnectionResetError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as exc:
        assert is_transient(exc)
    sleeps = []
    rec = vs.FileRecord.from_bytes(b"x")
    out, exc, attempts = apply_udf(lambda f: (_ for _ in ()).throw(TimeoutError("t")), rec,
                                   content.arrow_schema(), max_attempts=4, retry_backoff_s=0.5,
                                   sleep=sleeps.append)
    assert out is None and isinstance(exc, TimeoutError) and attempts == 4
    assert sleeps == [0.5, 1.0, 2.0]


def test_a_data_file_is_verified_as_it_reads_back_before_it_is_listed(tmp_path):
    # what a store that changes uploads leaves (DESIGN §7): framing around the bytes, a
    # cut-off object, another file's bytes under the name; none of them passes
    import pyarrow as pa
    from pyarrow import fs as pafs

    local = pafs.LocalFileSystem()
    path = str(tmp_path / "part.parquet")
    table = pa.table({"relative_path": ["a", "b"], "n": [1, 2]})
    size = write_parquet(local, path, table)
    assert size == os.path.getsize(path) and verify_data_file(local, path, size, 2) == size
    good = Path(path).read_bytes()
    for bad, why in ((b"737\r\n" + good + b"\r\n0\r\nx-amz-checksum-crc64nvme:AA==\r\n\r\n",
                      "bytes stored"), (good[: len(good) // 2], "bytes stored"),
                     (good[:-4] + b"XXXX", "magic bytes")):
        Path(path).write_bytes(bad)
        with pytest.raises(CorruptDataFileError, match=why):
            verify_data_file(local, path, len(good) if why == "bytes stored" else len(bad), 2)
    Path(path).write_bytes(good)
    with pytest.raises(CorruptDataFileError, match="2 rows stored, 3 written"):
        verify_data_file(local, path, size, 3)


def test_change_types_and_path_glob_filter_the_files(catalog, volume, data_dir):
    setup_stream(catalog, data_dir, {"a.txt": "1", "b.csv": "2", "keep/c.txt": "3"})
    pipeline = catalog.pipeline("s", content, "out", path_glob="*.txt")
    assert pipeline.run_once().files_seen == 2  # fnmatch: '*' crosses '/'
    write(data_dir, "a.txt", "11")
    (data_dir / "keep" / "c.txt").unlink()
    catalog.refresh("vol")
    m = catalog.pipeline("s", content, "out", path_glob=["*.txt"],
                         change_types=["INSERT"]).run_once()
    assert m.files_seen == 0  # an UPDATE_AFTER and a DELETE, neither selected
    assert [r["relative_path"] for r in table(catalog.pipeline("s", content, "out").target_uri)
            ] == ["a.txt", "keep/c.txt"]


def test_delete_rows_keeps_the_target_a_mirror_of_the_volume(catalog, volume, data_dir):
    files = {f"f{i}.txt": f"v1 {i}" for i in range(6)}
    setup_stream(catalog, data_dir, files)
    pipeline = catalog.pipeline("s", words, "mirror", on_delete="delete_rows")
    assert pipeline.run_once().rows_written == 12
    write(data_dir, "f1.txt", "v2")        # overwrite: rows replaced
    (data_dir / "f2.txt").unlink()          # delete: rows removed
    write(data_dir, "new.txt", "v1 new")    # insert
    catalog.refresh("vol")
    m = pipeline.run_once()
    assert (m.files_seen, m.files_ok, m.paths_deleted, m.rows_deleted, m.rows_written) == (
        3, 2, 1, 4, 3)
    rows = [(r["relative_path"], r["word"], r["__change_type"]) for r in table(
        pipeline.target_uri)]
    expected = sorted([(p, w, "INSERT") for p, t in files.items() if p not in ("f1.txt", "f2.txt")
                       for w in t.split()] + [("f1.txt", "v2", "UPDATE_AFTER"),
                                              ("new.txt", "v1", "INSERT"),
                                              ("new.txt", "new", "INSERT")])
    assert sorted(rows) == expected


def test_by_default_rows_of_deleted_files_stay(catalog, volume, data_dir):
    setup_stream(catalog, data_dir, {"a.txt": "a", "b.txt": "b"})
    pipeline = catalog.pipeline("s", content, "out")
    pipeline.run_once()
    (data_dir / "a.txt").unlink()
    catalog.refresh("vol")
    m = pipeline.run_once()
    assert (m.files_seen, m.rows_deleted, m.end_version) == (0, 0, 2)
    assert [r["relative_path"] for r in table(pipeline.target_uri)] == ["a.txt", "b.txt"]


def test_max_files_per_batch_commits_chunks_and_moves_the_offset_once(catalog, volume,
                                                                      data_dir):
    setup_stream(catalog, data_dir, {f"{i}.txt": str(i) for i in range(5)})
    pipeline = catalog.pipeline("s", content, "chunks", max_files_per_batch=2)
    m = pipeline.run_once()
    assert (m.files_ok, m.commits, m.rows_written) == (5, 3, 5)
    history = DeltaTable(pipeline.target_uri).history()
    assert sum(1 for h in history if h["operation"] == "WRITE") == 3
    assert catalog.describe_stream("s")["batch_id"] == 1
    assert len(table(pipeline.target_uri)) == 5


@vs.file_udf("content string")
def dies_on_marked(file: vs.FileRecord):
    """Kills the whole Spark task (not just this file) while `<dir>/DIE` exists."""
    if (Path(file.url.removeprefix("file://")).parent / "DIE").exists() and \
            file.name == "3.txt":
        raise SystemExit("task killed")
    return {"content": file.read_text()}


def test_a_failed_run_resumes_after_its_committed_chunks_and_keeps_its_range(
        catalog, volume, data_dir, ev):
    setup_stream(catalog, data_dir, {f"{i}.txt": str(i) for i in range(5)})
    write(data_dir, "DIE", "")
    pipeline = catalog.pipeline("s", dies_on_marked, "resume", max_files_per_batch=2,
                                path_glob="*.txt")
    with pytest.raises(Exception, match="task killed"):
        pipeline.run_once()
    assert len(table(pipeline.target_uri)) == 2  # the first chunk is committed
    on_disk = {p.name for p in Path(pipeline.target_uri).glob("*.parquet")}
    assert on_disk == {Path(u).name for u in DeltaTable(pipeline.target_uri).file_uris()}
    assert catalog.describe_stream("s")["offset"] == 0
    (data_dir / "DIE").unlink()
    write(data_dir, "late.txt", "arrived after the pin")
    catalog.refresh("vol")  # a new version: the retry must still end at version 1
    with pytest.raises(VolumeStreamError, match="other options"):
        catalog.pipeline("s", dies_on_marked, "resume", max_files_per_batch=2,
                         path_glob="[0-2].txt").run_once()
    m = pipeline.run_once()
    assert (m.start_version, m.end_version, m.resumed_files, m.files_ok) == (0, 1, 2, 3)
    assert sorted(r["content"] for r in table(pipeline.target_uri)) == list("01234")
    later = pipeline.run_once()
    assert (later.start_version, later.end_version, later.files_ok) == (1, 2, 1)
    assert len(table(pipeline.target_uri)) == 6


def test_two_runs_racing_on_one_batch_commit_it_once(catalog, volume, data_dir, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()

    @vs.file_udf("content string")
    def rendezvous(file):
        import time
        import uuid

        (gate / uuid.uuid4().hex).touch()  # both runs' tasks wait here for each other
        deadline = time.monotonic() + 60
        while len(list(gate.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"content": file.read_text()}

    setup_stream(catalog, data_dir, {"a.txt": "a"})
    other = vs.connect(catalog.warehouse.root, spark=catalog.spark)
    outcomes: list[str] = []

    def run(cat):
        try:
            cat.pipeline("s", rendezvous, "race", parallelism=1).run_once()
            outcomes.append("ok")
        except vs.ConsumeConflictError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=run, args=(c,)) for c in (catalog, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(outcomes)[0] == "ok" and "another consumer committed first" in sorted(
        outcomes)[1], outcomes
    target = str(catalog.warehouse.root / "tables" / "race")
    assert [r["content"] for r in table(target)] == ["a"]
    on_disk = {p.name for p in Path(target).glob("*.parquet")}
    assert on_disk == {Path(u).name for u in DeltaTable(target).file_uris()}  # loser cleaned up
    assert catalog.describe_stream("s")["batch_id"] == 1


def test_recreated_stream_is_a_new_application(catalog, volume, data_dir):
    setup_stream(catalog, data_dir, {"a.txt": "a"})
    assert catalog.pipeline("s", content, "out").run_once().files_ok == 1
    catalog.create_stream("s", on_volume="vol", show_initial_rows=True, replace=True)
    m = catalog.pipeline("s", content, "out").run_once()
    assert (m.batch_id, m.files_ok, m.resumed_files) == (0, 1, 0)  # not skipped as "done"
    assert len(table(catalog.pipeline("s", content, "out").target_uri)) == 2


def test_bad_pipeline_arguments_fail_clearly_and_write_nothing(catalog, volume, data_dir):
    setup_stream(catalog, data_dir, {"a.txt": "a"})
    with pytest.raises(InvalidInputError, match="decorated with @volume_stream.file_udf"):
        catalog.pipeline("s", lambda f: {}, "out")
    with pytest.raises(InvalidInputError, match="invalid on_delete 'drop'"):
        catalog.pipeline("s", content, "out", on_delete="drop")
    with pytest.raises(InvalidInputError, match="invalid change_types"):
        catalog.pipeline("s", content, "out", change_types=["CREATED"])
    with pytest.raises(InvalidInputError, match="max_files_per_batch must be a positive"):
        catalog.pipeline("s", content, "out", max_files_per_batch=0)
    with pytest.raises(InvalidInputError, match="unexpected keyword argument 'colour'"):
        catalog.pipeline("s", content, "out", colour="red")
    with pytest.raises(NotFoundError, match="stream 'nope' does not exist"):
        catalog.pipeline("nope", content, "out")
    with pytest.raises(InvalidInputError, match="is inside volume 'vol'"):
        catalog.pipeline("s", content, str(data_dir / "results" / "out"))
    with pytest.raises(InvalidInputError, match="invalid target name"):
        catalog.pipeline("s", content, "bad name")
    with pytest.raises(InvalidInputError, match="cannot parse schema 'width integr'"):
        catalog.pipeline("s", vs.file_udf("width integr")(lambda f: {}), "out")
    with pytest.raises(InvalidInputError, match="declares \\['relative_path'\\]"):
        catalog.pipeline("s", vs.file_udf("relative_path string")(lambda f: {}), "out")
    assert not (catalog.warehouse.root / "tables").exists()
    catalog.pipeline("s", content, "out").run_once()
    with pytest.raises(InvalidInputError, match="other types than the pipeline writes"):
        catalog.pipeline("s", words, "out").run_once()


def test_run_forever_stops_on_request(catalog, volume, data_dir):
    setup_stream(catalog, data_dir, {"a.txt": "a"})
    pipeline = catalog.pipeline("s", content, "out")
    assert [m.files_ok for m in pipeline.run_forever(0.01, max_batches=2)] == [1, 0]
    stop = threading.Event()
    stop.set()
    assert pipeline.run_forever(0.01, stop=stop) == []


def test_file_record_reads_lazily_and_streams(tmp_path):
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(1 << 20))
    rec = vs.FileRecord.from_path(path)
    assert (rec.relative_path, rec.name, rec.size) == ("big.bin", "big.bin", 1 << 20)
    with rec.open() as f:
        assert f.read(10) == path.read_bytes()[:10]
    assert rec.read_bytes() == path.read_bytes()
    text = vs.FileRecord.from_bytes("héllo".encode(), "x/y.txt")
    assert (text.read_text(), text.name, text.change_type) == ("héllo", "y.txt", "INSERT")
    assert content(text) == {"content": "héllo", "n_bytes": 6}
