"""Shard iterators: opaque, signed, expiring tokens naming a position in one shard.

A token is `base64url(json payload) "." base64url(HMAC-SHA256(payload))`, signed with a
per-warehouse secret kept in the warehouse (`_secrets/shard-iterator.key`, created with mode
0600 on first use; never a user credential). It expires 15 minutes after it was issued, as a
DynamoDB shard iterator does. A forged, altered or expired token raises `ExpiredIteratorError`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from collections import OrderedDict
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


_URLSAFE = bytes.maketrans(b"+/", b"-_")


def _b64(data: bytes) -> str:
    """URL-safe base64 without padding (`urlsafe_b64encode(data).rstrip(b"=")`)."""
    return binascii.b2a_base64(data, newline=False).translate(_URLSAFE).rstrip(b"=").decode()


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
        # HMAC-SHA256 (RFC 2104) with the key's pads hashed once, not per token: a token's
        # MAC is two copies of these and two short updates
        block = self._key if len(self._key) <= 64 else hashlib.sha256(self._key).digest()
        block = block.ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))
        self.ttl_s = ttl_s
        #: the payloads of the tokens this signer issued last (a reader hands each back)
        #: (an OrderedDict: dropping the oldest of a dict that keeps losing its first key
        #: scans the holes left in front, ~7 us a token)
        self._issued: OrderedDict[str, dict[str, Any]] = OrderedDict()
        #: `sign_position`'s JSON templates, per set of fixed fields
        self._templates: dict[tuple[tuple[str, str], ...], str] = {}

    def sign(self, payload: dict[str, Any], issued_at: float) -> str:
        signed = {**payload, "iat": round(issued_at, 3)}
        return self._issue(_ENCODE(signed).encode(), signed)

    def sign_position(self, fields: dict[str, str], pos: tuple[int, int],
                      issued_at: float) -> str:
        """`sign({**fields, "pos": list(pos)}, issued_at)` for string `fields` (a reader's
        next page): the same token, its JSON made from a template of the fields made once
        (a reader signs one per page; `json` costs more than the rest of the token)."""
        items = tuple(fields.items())
        template = self._templates.get(items)
        if template is None:
            marked = _ENCODE({**fields, "iat": 0, "pos": [1, 2]})
            template = marked.replace("%", "%%").replace('"iat":0', '"iat":%r', 1).replace(
                '"pos":[1,2]', '"pos":[%d,%d]', 1)
            if len(self._templates) >= _REMEMBERED:
                self._templates.clear()
            self._templates[items] = template
        iat = round(issued_at, 3)
        version, row = int(pos[0]), int(pos[1])
        return self._issue((template % (iat, version, row)).encode(),
                           {**fields, "pos": [version, row], "iat": iat})

    def _mac(self, body: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(body)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def _issue(self, body: bytes, signed: dict[str, Any]) -> str:
        token = f"{_b64(body)}.{_b64(self._mac(body))}"
        if len(self._issued) >= _REMEMBERED:
            self._issued.popitem(last=False)
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
        if not hmac.compare_digest(mac, self._mac(body)):
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
