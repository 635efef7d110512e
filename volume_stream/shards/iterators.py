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
import secrets
from typing import Any

from volume_stream.errors import ExpiredIteratorError
from volume_stream.warehouse.location import Location

__all__ = ["ITERATOR_TTL_S", "IteratorSigner"]

ITERATOR_TTL_S = 15 * 60
_KEY_FILE = "_secrets/shard-iterator.key"
#: tokens whose payloads a signer remembers
_REMEMBERED = 256
#: `json.dumps(payload, sort_keys=True, separators=(",", ":"))` without making an encoder
#: per token (a reader signs one per page)
_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _load_key(location: Location) -> bytes:
    if not location.exists(_KEY_FILE):
        location.create_text(_KEY_FILE, secrets.token_hex(32))  # the first writer wins
    return bytes.fromhex(location.read_text(_KEY_FILE).strip())


class IteratorSigner:
    """Signs and checks the shard iterators of one warehouse."""

    def __init__(self, location: Location, ttl_s: float = ITERATOR_TTL_S):
        self._key = _load_key(location)
        self._mac = hmac.new(self._key, digestmod=hashlib.sha256)
        self.ttl_s = ttl_s
        #: the payloads of the tokens this signer issued last (a reader hands each back)
        self._issued: dict[str, dict[str, Any]] = {}

    def sign(self, payload: dict[str, Any], issued_at: float) -> str:
        signed = {**payload, "iat": round(issued_at, 3)}
        body = _ENCODE(signed).encode()
        mac = self._mac.copy()  # the key's pads hashed once, not per token
        mac.update(body)
        mac = mac.digest()
        token = f"{_b64(body)}.{_b64(mac)}"
        if len(self._issued) >= _REMEMBERED:
            self._issued.pop(next(iter(self._issued)))
        self._issued[token] = signed  # as json.loads(body) reads it: str, int, list, float
        return token

    def verify(self, token: Any, now: float) -> dict[str, Any]:
        """The payload of a valid token issued less than the TTL ago (one this signer issued
        lately is known without checking its MAC again)."""
        payload = self._issued.get(token) if isinstance(token, str) else None
        if payload is not None:
            return self._fresh(dict(payload), now)
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
        return self._fresh(json.loads(body), now)

    def _fresh(self, payload: dict[str, Any], now: float) -> dict[str, Any]:
        age = now - float(payload["iat"])
        if age > self.ttl_s or age < -60:
            raise ExpiredIteratorError(
                f"shard iterator of shard {payload.get('shard')!r} expired: issued {age:.0f} s "
                f"ago, valid for {self.ttl_s:.0f} s; get a new one with get_shard_iterator")
        return payload
