"""The class-data archive `make install` builds (`python -m volume_stream._cds`): the
local Spark driver maps it, a JVM whose class path no longer matches ignores it without a word,
and a damaged archive never takes the place of a good one (a JVM mapping one crashes)."""

from __future__ import annotations

import re
import subprocess

import pytest

from volume_stream import _cds, _jars

QUIET = _jars.QUIET_CDS.split()  # the options beside -XX:SharedArchiveFile


def _archive():
    path = _jars.jars_dir() / _jars.ARCHIVE
    if not path.is_file():
        pytest.fail(f"no class-data archive {path}: run `make install` "
                    f"(or `python -m volume_stream._cds`)")
    return path


def test_the_local_driver_maps_the_archive(spark):
    """`jcmd VM.info` of this run's driver: the mapped CDS regions include the archive's bytes
    (the JDK's own base archive alone is ~13 MB)."""
    from pyspark import SparkContext

    path = _archive()
    args = [str(a) for a in spark.sparkContext._jvm.java.lang.management.ManagementFactory
            .getRuntimeMXBean().getInputArguments()]
    assert f"-XX:SharedArchiveFile={path}" in args, args
    info = subprocess.run(["jcmd", str(SparkContext._gateway.proc.pid), "VM.info"],
                          capture_output=True, text=True, check=True).stdout
    mapped = re.search(r"CDS archive\(s\) mapped at: .*?size (\d+)", info)
    assert mapped, info[:2000]
    assert int(mapped.group(1)) > path.stat().st_size


def test_a_jvm_with_another_class_path_ignores_it_silently(tmp_path):
    done = subprocess.run([_cds.java(), f"-XX:SharedArchiveFile={_archive()}", *QUIET,
                           "-cp", str(tmp_path), "-version"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "cds" not in done.stderr.lower(), done.stdout + done.stderr


def test_a_damaged_archive_is_refused_before_it_replaces_one(tmp_path):
    damaged = tmp_path / _jars.ARCHIVE
    with _archive().open("rb") as good:
        damaged.write_bytes(good.read(4096))  # a copy cut short
    with pytest.raises(RuntimeError, match="does not map"):
        _cds._check_archive(damaged)
    _cds._check_archive(_archive())  # the good one maps


def test_no_archive_means_no_option(tmp_path, monkeypatch):
    monkeypatch.setenv("VOLUME_STREAM_JARS", str(tmp_path))
    assert _jars.archive_options() == ""
