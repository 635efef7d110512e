"""Checking an AWS Signature Version 4 with botocore's own signer.

The request's canonical form is rebuilt from the headers its `Authorization` header lists as
signed, and botocore's `SigV4Auth` computes the signature those keys would give at the
request's `X-Amz-Date`; the two are compared in constant time. An unknown access key is
`UnrecognizedClientException`; a wrong signature, a bad header or a date more than 15 minutes
off is `InvalidSignatureException`, as DynamoDB answers.

The signature binds the request: `host`, `x-amz-date` and `x-amz-target` must be among the
signed headers, the credential scope must name the service `dynamodb` and the server's region,
and the body is hashed here (an `x-amz-content-sha256` header, `UNSIGNED-PAYLOAD` included,
must equal that hash; botocore's signer would take it on trust). A header sent twice is
refused before this (`serve.server`): the one checked would not be the one read.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from datetime import UTC, datetime

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from connectors.secrets import reveal
from volume_stream.shards.log import DEFAULT_REGION

__all__ = ["SignatureError", "verify"]

_AUTH = re.compile(r"^AWS4-HMAC-SHA256\s+Credential=([^/,\s]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request"
                   r"\s*,\s*SignedHeaders=([a-z0-9;\-]+)\s*,\s*Signature=([0-9a-f]{64})\s*$")
MAX_SKEW_S = 15 * 60
SERVICE = "dynamodb"
#: headers every signature must cover: where it goes, when, and which operation runs
MUST_SIGN = ("host", "x-amz-date", "x-amz-target")


class SignatureError(Exception):
    """Refused: `code` is the DynamoDB error type to answer with."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _invalid(message: str) -> SignatureError:
    return SignatureError("InvalidSignatureException", message)


def verify(method: str, path: str, headers: dict[str, str], body: bytes,
           keys: dict[str, str], now: datetime | None = None, *,
           region: str = DEFAULT_REGION) -> str:
    """The access key id of a request validly signed with one of `keys` for DynamoDB in
    `region`; else SignatureError. `headers` must hold each header once."""
    lower = {k.lower(): v for k, v in headers.items()}
    auth = lower.get("authorization")
    if not auth:
        raise SignatureError("MissingAuthenticationTokenException",
                             "Request is missing Authentication Token")
    m = _AUTH.match(auth.strip())
    if not m:
        raise SignatureError("InvalidSignatureException", "Authorization header is malformed")
    key_id, day, scope_region, service, signed, signature = m.groups()
    secret = reveal(keys.get(key_id))
    if secret is None:
        raise SignatureError("UnrecognizedClientException",
                             "The security token included in the request is invalid.")
    amz_date = lower.get("x-amz-date", "")
    try:
        when = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError as exc:
        raise SignatureError("InvalidSignatureException", "X-Amz-Date is missing or malformed"
                             ) from exc
    now = now or datetime.now(UTC)
    if abs((now - when).total_seconds()) > MAX_SKEW_S or day != amz_date[:8]:
        raise SignatureError("InvalidSignatureException",
                             f"Signature expired: {amz_date} is not within 15 minutes of now")
    if service != SERVICE:
        raise _invalid(f"Credential should be scoped to correct service: '{SERVICE}', "
                       f"not {service!r}.")
    if scope_region != region:
        raise _invalid(f"Credential should be scoped to a valid region: '{region}', "
                       f"not {scope_region!r}.")
    names = signed.split(";")
    unsigned = [n for n in MUST_SIGN if n not in names]
    if unsigned:
        raise _invalid(f"SignedHeaders must include {', '.join(unsigned)}")
    missing = [n for n in names if n not in lower]
    if missing:
        raise _invalid(f"signed headers are missing from the request: {', '.join(missing)}")
    digest = hashlib.sha256(body).hexdigest()
    claimed = lower.get("x-amz-content-sha256")
    if claimed is not None and claimed.strip().lower() != digest:
        raise _invalid(f"The provided 'x-amz-content-sha256' header ({claimed.strip()!r}) does "
                       f"not match the SHA-256 of the body ({digest})")
    request = AWSRequest(method=method, url=f"http://{lower['host']}{path}",
                         headers={n: lower[n] for n in names if n != "host"}, data=body)
    request.headers["host"] = lower["host"]
    request.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(key_id, secret), service, scope_region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected, signature):
        raise SignatureError("InvalidSignatureException",
                             "The request signature we calculated does not match the "
                             "signature you provided.")
    return key_id
