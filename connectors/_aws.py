"""Old home of the boto3 client helpers; they live in `connectors.aws.client` now."""

from connectors.aws.client import (
    ClientOptions,
    error_code,
    region_from_queue_url,
    translate_errors,
)
from connectors.errors import is_transient

__all__ = ["ClientOptions", "error_code", "is_transient", "region_from_queue_url",
           "translate_errors"]
