"""An export range must have ended a safety lag ago (`SAFETY_LAG_MS`): a commit's timestamp is
taken before its log entry lands, so an end at (or just before) now could be marked done in
the status table while a commit inside the range is still on its way, and be missed forever."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

import volume_stream as vs
from volume_stream.cli.app import app
from volume_stream.errors import InvalidInputError, VolumeStreamError
from volume_stream.shards.export import SAFETY_LAG_MS


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def cat(tmp_path, data_dir, ev):
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("vol", data_dir)
    cat.directory_table("vol").apply([ev.put("a.txt")])
    return cat


def test_an_end_in_the_near_future_is_refused_naming_end_and_lag(cat, tmp_path):
    end = now_ms() + 500
    with pytest.raises(VolumeStreamError) as info:
        cat.export_changes("vol", start_ms=0, end_ms=end, out=tmp_path / "o",
                           status_table="st")
    message = str(info.value)
    assert isinstance(info.value, InvalidInputError)
    assert "'vol'" in message and str(end) in message and f"{SAFETY_LAG_MS} ms" in message
    assert not (tmp_path / "o").exists()
    assert not (cat.warehouse.root / "export_status" / "st").exists()  # nothing marked done


def test_an_end_inside_the_lag_is_refused_then_accepted_once_settled(cat, tmp_path):
    assert SAFETY_LAG_MS >= 1000
    committed = now_ms()  # the fixture's commit is stamped at or before this
    while now_ms() <= committed + 20:  # the clock (the condition) passes the commit's time
        time.sleep(0.005)
    end = now_ms() - 10   # already past, but commits stamped before it may still be landing
    with pytest.raises(InvalidInputError, match="safety lag"):
        cat.export_changes("vol", start_ms=0, end_ms=end, out=tmp_path / "o")
    # a smaller lag (a caller who knows no commit is in flight) may be given explicitly
    with pytest.raises(InvalidInputError, match="safety_lag_ms"):
        cat.export_changes("vol", start_ms=0, end_ms=end, out=tmp_path / "o",
                           safety_lag_ms=-1)
    assert cat.export_changes("vol", start_ms=0, end_ms=end, out=tmp_path / "o",
                              safety_lag_ms=0).records == 1


def test_the_cli_refuses_a_future_end_and_takes_the_lag_option(cat, tmp_path):
    wh = ["--warehouse", str(cat.warehouse.root)]
    end = now_ms() + 500
    res = CliRunner().invoke(app, ["export", "vol", "--start-ms", "0", "--end-ms", str(end),
                                   "--out", str(tmp_path / "cli"), *wh])
    assert isinstance(res.exception, InvalidInputError)   # main() prints it as one line, exit 1
    assert "safety lag" in str(res.exception) and str(end) in str(res.exception)
    end = now_ms() - 10
    res = CliRunner().invoke(app, ["export", "vol", "--start-ms", "0", "--end-ms", str(end),
                                   "--out", str(tmp_path / "cli"), "--safety-lag-ms", "0", *wh])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["records"] == 1
