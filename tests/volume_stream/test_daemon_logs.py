"""Structured logs for the daemon: JSON lines with extras, and no credentials in any line."""

from __future__ import annotations

import io
import json
import logging

import pytest

from volume_stream.daemon.logs import JsonFormatter, TextFormatter, configure_logging, secret_values


@pytest.fixture
def restore_root_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def test_json_lines_carry_extras_and_exceptions(restore_root_logging):
    buf = io.StringIO()
    configure_logging("INFO", json_lines=True, stream=buf)
    log = logging.getLogger("volume_stream.daemon")
    log.info("committed version %d", 7, extra={"volume": "landing", "version": 7})
    log.debug("not shown")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("apply failed", extra={"volume": "landing"})
    first, second = (json.loads(line) for line in buf.getvalue().splitlines())
    assert first["message"] == "committed version 7" and first["level"] == "INFO"
    assert first["volume"] == "landing" and first["version"] == 7
    assert first["logger"] == "volume_stream.daemon" and first["ts"].endswith("Z")
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exception"]


def test_secret_values_are_masked_in_json_and_text(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value-123")
    monkeypatch.setenv("ALIBABA_CLOUD_SECURITY_TOKEN", "tok-abcdef")
    monkeypatch.setenv("SHORT_TOKEN", "abc")  # too short to mask without mangling text
    assert set(secret_values()) >= {"s3cr3t-value-123", "tok-abcdef"}
    assert "abc" not in secret_values()
    record = logging.LogRecord("x", logging.WARNING, __file__, 1,
                               "client failed with key %s and token %s", ("s3cr3t-value-123",
                                                                         "tok-abcdef"), None)
    record.url = "https://h/?X-Amz-Security-Token=tok-abcdef"
    for formatter in (JsonFormatter(), TextFormatter()):
        line = formatter.format(record)
        assert "s3cr3t-value-123" not in line and "tok-abcdef" not in line
        assert "***" in line


def test_text_format_shows_extras(restore_root_logging):
    buf = io.StringIO()
    configure_logging("warning", stream=buf)
    logging.getLogger("t").warning("slow", extra={"volume": "v", "seconds": 1.5})
    assert buf.getvalue().rstrip().endswith("WARNING t: slow volume=v seconds=1.5")
