"""Old home of the SQS listener; it lives in `connectors.aws.listener` now (names kept)."""

from connectors.aws.events import ParsedMessage, S3Record, parse_message, to_file_event
from connectors.aws.listener import SqsListener

__all__ = ["ParsedMessage", "S3Record", "SqsListener", "parse_message", "to_file_event"]
