"""The `volume-stream shard-api` command: the DynamoDB Streams-compatible HTTP endpoint over a
warehouse's change logs (`volume_stream.serve`).

    volume-stream shard-api --warehouse ./warehouse --listen 127.0.0.1:8000 \\
        [--access-key-id ID --secret-access-key SECRET] [--region R] [--account-id 12DIGITS]
        [--allow-anonymous]

With keys, every request must be SigV4-signed with them (for the service dynamodb in --region,
default us-east-1); the secret can also come from $VOLUME_STREAM_SHARD_API_SECRET so it stays
out of the process list. Without keys, a --listen address other than a loopback one is refused
unless --allow-anonymous. Ctrl-C stops it.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from volume_stream.cli._common import Warehouse, catalog, err
from volume_stream.errors import InvalidInputError
from volume_stream.serve import ShardApiServer
from volume_stream.serve.server import parse_listen

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the `shard-api` command to the `volume-stream` app."""

    @app.command("shard-api")
    def shard_api(
        listen: Annotated[str, typer.Option(help="HOST:PORT to bind.")] = "127.0.0.1:8000",
        access_key_id: Annotated[str | None, typer.Option(
            help="Require SigV4 requests signed with this key.")] = None,
        secret_access_key: Annotated[str | None, typer.Option(
            help="Its secret (or $VOLUME_STREAM_SHARD_API_SECRET).")] = None,
        region: Annotated[str | None, typer.Option(
            help="Region of the stream ARNs and of the SigV4 credential scope clients must "
                 "sign for (default us-east-1).")] = None,
        account_id: Annotated[str | None, typer.Option(
            help="12-digit account in the stream ARNs.")] = None,
        allow_anonymous: Annotated[bool, typer.Option(
            "--allow-anonymous", help="Serve without keys on a non-loopback --listen address "
            "(anyone who can reach it reads every change log).")] = False,
        warehouse: Warehouse = None,
    ) -> None:
        """Serve the change logs as the DynamoDB Streams API (ListStreams, DescribeStream,
        GetShardIterator, GetRecords)."""
        secret = secret_access_key or os.environ.get("VOLUME_STREAM_SHARD_API_SECRET")
        if bool(access_key_id) != bool(secret):
            raise InvalidInputError("--access-key-id and --secret-access-key go together")
        host, port = parse_listen(listen)
        server = ShardApiServer(catalog(warehouse), host, port,
                                keys={access_key_id: secret} if access_key_id else None,
                                region=region, account_id=account_id,
                                allow_anonymous=allow_anonymous)
        err.print(f"shard API on {server.url} "
                  f"({'SigV4 required' if access_key_id else 'no authentication'}); "
                  f"Ctrl-C stops it", highlight=False)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
