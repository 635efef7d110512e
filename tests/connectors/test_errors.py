"""One error tree and one `is_transient` rule for every provider."""

from __future__ import annotations

import botocore.exceptions as bce
import oss2.exceptions as oe
import pytest
import requests
from mns.mns_exception import MNSClientNetworkException, MNSServerException

from connectors.alicloud.client import translate_mns_errors, translate_oss_errors
from connectors.aws.client import ClientOptions, translate_errors
from connectors.errors import (
    ConnectorError,
    InvalidPathError,
    ListenerClosedError,
    ObjectChangedError,
    TransientError,
    is_transient,
)
from connectors.events import validate_relative_path


def client_error(code: str, status: int) -> bce.ClientError:
    return bce.ClientError({"Error": {"Code": code, "Message": "m"},
                            "ResponseMetadata": {"HTTPStatusCode": status}}, "ReceiveMessage")


def oss_error(status: int, code: str) -> oe.OssError:
    kind = oe.PreconditionFailed if status == 412 else oe.ServerError
    return kind(status, {}, b"", {"Code": code, "Message": "m"})


@pytest.mark.parametrize(("exc", "transient"), [
    (TransientError("x"), True),
    (ConnectionResetError(), True),
    (TimeoutError(), True),
    (ConnectorError("x"), False),
    (ListenerClosedError("x"), False),
    (ValueError("x"), False),
    (client_error("SlowDown", 503), True),
    (client_error("ThrottlingException", 400), True),
    (client_error("AccessDenied", 403), False),
    (bce.EndpointConnectionError(endpoint_url="http://x"), True),
    (MNSClientNetworkException("NetworkException", "reset"), True),
    (MNSServerException("ServerBusy", "busy", "r", "h"), True),
    (MNSServerException("QueueNotExist", "no", "r", "h"), False),
    (requests.exceptions.ChunkedEncodingError("cut"), True),
    (oss_error(503, "ServiceUnavailable"), True),
    (oss_error(403, "AccessDenied"), False),
])
def test_one_rule_for_every_provider(exc, transient):
    assert is_transient(exc) is transient
    wrapped = ConnectorError("converted")
    wrapped.__cause__ = exc
    assert is_transient(wrapped) is transient  # a converted error is judged by its cause


def test_translators_raise_transient_errors_for_transient_causes():
    with pytest.raises(TransientError) as info, translate_errors("sqs", "ReceiveMessage q",
                                                                ClientOptions()):
        raise client_error("ServiceUnavailable", 503)
    assert isinstance(info.value.__cause__, bce.ClientError)
    with pytest.raises(ConnectorError) as info, translate_errors("sqs", "x", ClientOptions()):
        raise client_error("AccessDenied", 403)
    assert not isinstance(info.value, TransientError)
    with pytest.raises(TransientError), translate_mns_errors("BatchReceiveMessage q"):
        raise MNSClientNetworkException("NetworkException", "reset")
    with pytest.raises(TransientError), translate_oss_errors("GetObject", "oss://b/k"):
        raise oss_error(500, "InternalError")
    with pytest.raises(ObjectChangedError, match="changed while it was being read"), \
            translate_oss_errors("GetObject", "oss://b/k"):
        raise oss_error(412, "PreconditionFailed")


def test_invalid_path_error_is_a_connector_error_and_a_value_error():
    with pytest.raises(InvalidPathError) as info:
        validate_relative_path("../x")
    assert isinstance(info.value, ConnectorError) and isinstance(info.value, ValueError)
