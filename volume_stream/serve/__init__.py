"""HTTP front doors over a warehouse: the DynamoDB Streams-compatible shard API (issue 15)."""

from volume_stream.serve.dynamodb import StreamsApi
from volume_stream.serve.server import ShardApiServer

__all__ = ["ShardApiServer", "StreamsApi"]
