"""Where the daemon puts events it could not commit (DESIGN §3, §7).

A local folder gets `<dir>/<volume>.jsonl`, appended to. An object store cannot append, so
each batch of poison events becomes one object, `<dir>/<volume>/<UTC time>-<id>.jsonl`
(JSON lines, one event a line).

    letters = DeadLetters("s3://bucket/wh/_dead_letter", "landing")
    letters.write([{"event": {...}, "error": "..."}])
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from directory_table.roles import fresh, live_options
from directory_table.storage import filesystem_for, s3_client, split_s3

__all__ = ["DeadLetters"]


class DeadLetters:
    """The dead letters of one volume under `where` (a folder or a URI)."""

    def __init__(self, where: str | os.PathLike, volume: str,
                 storage_options: dict[str, str] | None = None) -> None:
        text = os.fspath(where)
        self.remote = "://" in text and not text.startswith("file://")
        self.volume = volume
        self._options = live_options(storage_options)
        if self.remote:
            self.location = f"{text.rstrip('/')}/{volume}/"
        else:
            self.file = Path(text.removeprefix("file://")) / f"{volume}.jsonl"
            self.location = str(self.file)

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs's options with current credentials (DESIGN §3.2)."""
        return fresh(self._options)

    def __repr__(self) -> str:
        return f"DeadLetters({self.location!r})"

    def write(self, records: list[dict[str, Any]]) -> str:
        """Store `records`; returns where they went. Raises OSError if it cannot."""
        lines = "".join(json.dumps(r, default=str, ensure_ascii=False) + "\n" for r in records)
        if not self.remote:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            with self.file.open("a", encoding="utf-8") as fh:
                fh.write(lines)
            return str(self.file)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        uri = f"{self.location}{stamp}-{uuid.uuid4().hex[:8]}.jsonl"
        if uri.startswith(("s3://", "s3a://")):
            from botocore.exceptions import BotoCoreError, ClientError

            bucket, key = split_s3(uri)
            try:
                s3_client(self.storage_options).put_object(Bucket=bucket, Key=key,
                                                           Body=lines.encode("utf-8"))
            except (BotoCoreError, ClientError) as exc:
                raise OSError(f"{uri}: {exc}") from exc
            return uri
        fs, path = filesystem_for(uri, self.storage_options)
        with fs.open_output_stream(path) as out:
            out.write(lines.encode("utf-8"))
        return uri
