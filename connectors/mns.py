"""Old home of the MNS listener; it lives in `connectors.alicloud.listener` now (names kept)."""

from connectors.alicloud.events import (
    OssRecord,
    ParsedMessage,
    _tie_break,
    parse_message,
    to_file_event,
)
from connectors.alicloud.listener import MnsHandle, MnsListener

__all__ = ["MnsHandle", "MnsListener", "OssRecord", "ParsedMessage", "_tie_break",
           "parse_message", "to_file_event"]
