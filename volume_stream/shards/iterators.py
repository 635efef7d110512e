"""Shard iterators: opaque, signed, expiring tokens naming a position in one shard.

A token is `base64url(json payload) "." base64url(HMAC-SHA256(payload))`, signed with a
per-warehouse secret kept in the warehouse (`_secrets/shard-iterator.key`, created with mode
0600 on first use; never a user credential). It expires 15 minutes after it was issued, as a
DynamoDB shard iterator does. A forged, altered or expired token raises `ExpiredIteratorError`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any

from volume_stream.errors import ExpiredIteratorError

__all__ = ["ITERATOR_TTL_S", "IteratorSigner"]

ITERATOR_TTL_S = 15 * 60
_KEY_FILE = Path("_secrets") / "shard-iterator.key"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _load_key(root: Path) -> bytes:
    path = root / _KEY_FILE
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o700, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    try:
        os.link(tmp, path)  # the first writer wins; a racing one reads the winner's key
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return bytes.fromhex(path.read_text().strip())


class IteratorSigner:
    """Signs and checks the shard iterators of one warehouse."""

    def __init__(self, warehouse_root: str | os.PathLike, ttl_s: float = ITERATOR_TTL_S):
        self._key = _load_key(Path(warehouse_root))
        self.ttl_s = ttl_s

    def sign(self, payload: dict[str, Any], issued_at: float) -> str:
        body = json.dumps({**payload, "iat": round(issued_at, 3)}, sort_keys=True,
                          separators=(",", ":")).encode()
        mac = hmac.new(self._key, body, hashlib.sha256).digest()
        return f"{_b64(body)}.{_b64(mac)}"

    def verify(self, token: Any, now: float) -> dict[str, Any]:
        """The payload of a valid token issued less than the TTL ago."""
        if not isinstance(token, str) or token.count(".") != 1 or len(token) > 4096:
            raise ExpiredIteratorError("shard iterator is not one this warehouse issued")
        body_text, mac_text = token.split(".")
        try:
            body, mac = _unb64(body_text), _unb64(mac_text)
        except ValueError as exc:
            raise ExpiredIteratorError("shard iterator is not one this warehouse issued") from exc
        expected = hmac.new(self._key, body, hashlib.sha256).digest()
        if not hmac.compare_digest(mac, expected):
            raise ExpiredIteratorError("shard iterator is not one this warehouse issued "
                                       "(forged or altered)")
        payload = json.loads(body)
        age = now - float(payload["iat"])
        if age > self.ttl_s or age < -60:
            raise ExpiredIteratorError(
                f"shard iterator of shard {payload.get('shard')!r} expired: issued {age:.0f} s "
                f"ago, valid for {self.ttl_s:.0f} s; get a new one with get_shard_iterator")
        return payload
