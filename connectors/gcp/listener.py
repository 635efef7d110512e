"""The Pub/Sub listener: GCS object events of one volume from a subscription (DESIGN §6).

A bucket's notification config (`gcloud storage buckets notifications create`) publishes
each object change to a topic; this listener pulls a subscription of it with unary Pull calls
on the `connectors._queue.QueueListener` base (one long poll, then a parallel drain of a
backlog), parses each message (`connectors.gcp.events.parse_message`, a pure function) and
maps it to the volume's events (their sequencers, made of the object generation, put a
key's events in order in the directory table, whatever order Pub/Sub delivers them in). A message is acknowledged only by `ack`, after the
caller's commit; until then the ack deadline (the subscription's, or `visibility_timeout`)
hides it from other pullers. A message that cannot be parsed is logged, counted and never
acknowledged: it is redelivered until the subscription's dead-letter policy takes it.

The calls it makes are Pull, Acknowledge, ModifyAckDeadline and GetSubscription (the
subscription's ack deadline, once): `roles/pubsub.subscriber` grants them (deploy/gcp/).
Use it like any listener: receive, commit the events, then `ack(batch.handles)`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar

import google.api_core.exceptions as gexc

from connectors._queue import QueueListener
from connectors.gcp.client import GcpOptions, translate_errors
from connectors.gcp.events import ParsedMessage, parse_message, to_file_event
from connectors.gcp.store import GcsScope

__all__ = ["PubSubListener"]

logger = logging.getLogger("connectors.pubsub")


#: the deadline of a Pull that should not wait (a drain's, a group commit's "anything more?"):
#: Pub/Sub holds a Pull open until a message comes or its deadline passes, and its
#: `return_immediately` is deprecated; an answer with messages comes well within this
_SHORT_WAIT_S = 0.1


def _check_subscription(name: str) -> str:
    parts = name.split("/")
    if len(parts) != 4 or parts[0] != "projects" or parts[2] != "subscriptions" \
            or not parts[1] or not parts[3]:
        raise ValueError(f"subscription must be 'projects/PROJECT/subscriptions/NAME': {name!r}")
    return name


class PubSubListener(QueueListener):
    """Receive the GCS events of one volume from a Pub/Sub subscription (`Listener`).

    Args:
        subscription: "projects/PROJECT/subscriptions/NAME".
        bucket: The volume's bucket; events of other buckets are acked and ignored.
        prefix: The volume's prefix; events outside it are ignored.
        recursive: When False, only direct children of the prefix count.
        suffix: Keep only names ending with this (or one of these).
        max_workers: Parallel Pull calls while draining a backlog.
        wait_time_seconds: How long the first Pull of a receive waits for messages.
        pull_timeout_s: The deadline of one waiting Pull call (the service may answer an
            empty Pull early or late; the listener pulls again until `wait_time_seconds`).
        visibility_timeout: The ack deadline given to received messages; None keeps the
            subscription's.
        batch_size: Messages asked for per Pull call (at most 1000).
        max_batch_messages: Stop draining once this many messages are received.
        **client_options: `GcpOptions` fields (project, credentials_file, pubsub_endpoint).

    Example:
        >>> sub = "projects/p/subscriptions/in-events"
        >>> with PubSubListener(sub, bucket="bkt", prefix="in/") as listener:  # doctest: +SKIP
        ...     batch = listener.receive(timeout=5)
    """

    max_messages = 1000  # Pub/Sub's most per Pull / Acknowledge call
    thread_prefix = "volume-stream-pubsub"
    extra_counters = ("skipped",)
    log: ClassVar[logging.Logger] = logger
    default_visibility = 10  # Pub/Sub's default ack deadline
    parse_message = staticmethod(parse_message)
    to_file_event = staticmethod(to_file_event)
    _delete_action = "Acknowledge"
    _extend_action = "ModifyAckDeadline"

    def __init__(self, subscription: str, *, bucket: str, prefix: str = "",
                 recursive: bool = True, suffix: str | tuple[str, ...] | None = None,
                 max_workers: int = 4, wait_time_seconds: int = 20, pull_timeout_s: float = 10.0,
                 visibility_timeout: int | None = None, batch_size: int = 100,
                 max_batch_messages: int = 1000, **client_options: Any) -> None:
        if not 0 <= wait_time_seconds <= 600:
            raise ValueError(f"wait_time_seconds must be in 0..600: {wait_time_seconds}")
        if not 1 <= batch_size <= self.max_messages or pull_timeout_s <= 0:
            raise ValueError(f"batch_size must be in 1..1000 and pull_timeout_s > 0: "
                             f"{batch_size}, {pull_timeout_s}")
        if visibility_timeout is not None and not 10 <= visibility_timeout <= 600:
            raise ValueError(f"visibility_timeout (an ack deadline) must be in 10..600 s: "
                             f"{visibility_timeout}")
        self._setup(GcsScope(bucket, prefix, recursive, suffix), batch_size=batch_size,
                    wait_seconds=wait_time_seconds, max_workers=max_workers,
                    max_batch_messages=max_batch_messages, visibility_timeout=visibility_timeout)
        self.subscription = self.name = _check_subscription(subscription)
        self.pull_timeout_s = pull_timeout_s
        self._options = GcpOptions.of(**client_options)
        self._client = self._options.subscriber()

    def __repr__(self) -> str:
        return f"PubSubListener({self.subscription!r}, {self.scope!r}, {self._options!r})"

    def backlog(self) -> int | None:
        """Unknown here: Pub/Sub reports a subscription's backlog through Cloud Monitoring
        (`num_undelivered_messages`), not the subscriber API."""
        return None

    def _read_visibility(self) -> int:
        with translate_errors("pubsub", f"GetSubscription {self.subscription}", self._options):
            return int(self._client.get_subscription(
                subscription=self.subscription).ack_deadline_seconds or self.default_visibility)

    # -- QueueListener hooks ------------------------------------------------------------------
    def _receive_call(self, count: int, wait: int) -> list[Any]:
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            got = self._pull(count, min(left, self.pull_timeout_s) if wait else 0)
            if got or left <= 0 or self.closed:
                break
        if got and self.visibility_timeout is not None:
            self._change_visibility([m.ack_id for m in got], self.visibility_timeout)
        return got

    def _pull(self, count: int, wait: float) -> list[Any]:
        """One Pull waiting up to `wait` seconds for a message (0: a short wait, for a drain:
        Pub/Sub's `return_immediately` is deprecated)."""
        with translate_errors("pubsub", f"Pull {self.subscription}", self._options):
            try:
                response = self._client.pull(subscription=self.subscription,
                                             max_messages=count, timeout=wait or _SHORT_WAIT_S,
                                             retry=None)
            except (gexc.DeadlineExceeded, gexc.Cancelled):
                # nothing came within the wait (a stream cut at its deadline may say
                # CANCELLED); anything the service handed out meanwhile comes back once its
                # ack deadline passes
                return []
        return list(response.received_messages)

    def _message_id(self, raw: Any) -> str:
        return raw.message.message_id

    def _handle(self, raw: Any) -> str:
        return raw.ack_id

    def _body(self, raw: Any) -> dict[str, Any]:
        return {"attributes": dict(raw.message.attributes), "data": raw.message.data}

    def _receive_count(self, raw: Any) -> int | None:
        return raw.delivery_attempt or None  # set when the subscription has a dead-letter topic

    def _count(self, parsed: ParsedMessage, info: dict[str, int]) -> None:
        info["skipped"] += parsed.skipped

    def _delete(self, chunk: list[str]) -> list[str]:
        with translate_errors("pubsub", f"Acknowledge {self.subscription}", self._options):
            self._client.acknowledge(subscription=self.subscription, ack_ids=chunk)
        return []

    def _change_visibility(self, chunk: list[str], seconds: int) -> list[str]:
        with translate_errors("pubsub", f"ModifyAckDeadline {self.subscription}",
                              self._options):
            self._client.modify_ack_deadline(subscription=self.subscription, ack_ids=chunk,
                                             ack_deadline_seconds=seconds)
        return []

    def _close_connections(self) -> None:
        """The client's channel stays open: `ack` keeps working after `close`."""
