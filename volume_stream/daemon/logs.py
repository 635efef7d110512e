"""Logging for long-running processes: one JSON object per line (`--log-json`) or plain text.

Fields passed with `extra=` (volume, version, events, seconds...) become JSON keys, so a log
pipeline can filter on them. Any value of a credential-looking environment variable
(`*SECRET*`, `*TOKEN*`, `*PASSWORD*`) that slips into a message is replaced by `***`: logs
never carry credentials (DESIGN §6).

    configure_logging("INFO", json_lines=True)
    log.info("committed version %d", 7, extra={"volume": "landing", "version": 7})
    # {"ts": "2026-01-01T00:00:00.000Z", "level": "INFO", "logger": "...",
    #  "message": "committed version 7", "volume": "landing", "version": 7}
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import IO, Any

from connectors.secrets import is_secret

__all__ = ["JsonFormatter", "TextFormatter", "configure_logging", "secret_values"]

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName"}


def secret_values(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Values of credential-looking environment variables, longest first (to mask in logs).

    Example:
        >>> secret_values({"AWS_SECRET_ACCESS_KEY": "abcdef123", "HOME": "/root"})
        ('abcdef123',)
    """
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items()
              if is_secret(k) and len(v) >= 6}
    return tuple(sorted(values, key=len, reverse=True))


def _mask(text: str, secrets: tuple[str, ...]) -> str:
    for value in secrets:
        if value in text:
            text = text.replace(value, "***")
    return text


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC, ms), level, logger, message, extras, exception."""

    def __init__(self, secrets: tuple[str, ...] | None = None) -> None:
        super().__init__()
        self.secrets = secret_values() if secrets is None else secrets

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC)
        doc: dict[str, Any] = {
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _extras(record).items():
            doc.setdefault(key, value)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        line = json.dumps(doc, default=str, ensure_ascii=False)
        return _mask(line, self.secrets)


class TextFormatter(logging.Formatter):
    """`2026-01-01 00:00:00,000 INFO logger: message key=value ...`, secrets masked."""

    def __init__(self, secrets: tuple[str, ...] | None = None) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.secrets = secret_values() if secrets is None else secrets

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extras = _extras(record)
        if extras:
            text += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return _mask(text, self.secrets)


def configure_logging(level: str = "INFO", *, json_lines: bool = False,
                      stream: IO[str] | None = None) -> logging.Handler:
    """Send every log record at `level` or above to `stream` (stderr), as JSON or text.

    Replaces the root logger's handlers, quiets chatty libraries (botocore, urllib3, py4j)
    to WARNING, and returns the handler.

    Example:
        >>> handler = configure_logging("INFO", json_lines=True)
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # azure-core logs every HTTP request and response with their headers at INFO
    for noisy in ("botocore", "boto3", "urllib3", "py4j", "werkzeug", "s3transfer", "azure"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    return handler
