"""The pure parser of GCS Pub/Sub notifications (connectors.gcp.events): the attributes and
JSON_API_V1 payloads GCS documents (and fake-gcs-server publishes), overwrites as one change,
metadata updates skipped, generations ordering a key's events numerically, malformed and
foreign messages refused with a clear error."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from connectors.errors import MalformedMessageError
from connectors.events import EventKind, compare_sequencers
from connectors.gcp.events import etag_of, parse_message, sequencer, to_file_event
from connectors.gcp.store import GcsScope
from directory_table.batch import sequencer_keys

MD5 = base64.b64encode(bytes.fromhex("5d41402abc4b2a76b9719d911017c592")).decode()


def message(event_type: str = "OBJECT_FINALIZE", key: str = "in/a.csv", generation: int = 7,
            *, bucket: str = "bkt", size: int | str = "5", data: object = None, **extra: str):
    attributes = {"eventType": event_type, "bucketId": bucket, "objectId": key,
                  "objectGeneration": str(generation), "eventTime": "2026-01-02T03:04:05.5Z",
                  "payloadFormat": "JSON_API_V1", "notificationConfig":
                  f"projects/_/buckets/{bucket}/notificationConfigs/1", **extra}
    if data is None:
        data = json.dumps({"kind": "storage#object", "id": f"{bucket}/{key}/{generation}",
                           "name": key, "bucket": bucket, "generation": str(generation),
                           "size": str(size), "md5Hash": MD5, "crc32c": "yZRlqg==",
                           "updated": "2026-01-02T03:04:05.123456Z"}).encode()
    return {"attributes": attributes, "data": data}


def test_finalize_is_created_with_size_md5_generation_and_updated_time():
    parsed = parse_message(message(), message_id="m1")
    (rec,) = parsed.records
    assert (rec.kind, rec.bucket, rec.key, rec.size, rec.etag, rec.version_id) == (
        EventKind.CREATED, "bkt", "in/a.csv", 5, "5d41402abc4b2a76b9719d911017c592", "7")
    assert rec.url == "gs://bkt/in/a.csv" and parsed.message_id == "m1"
    event = to_file_event(rec, GcsScope("bkt", "in/"), source_id="m1")
    assert event.relative_path == "a.csv" and event.size == 5
    # the object's own time (microseconds, as a listing has it), not the event's
    assert event.last_modified_time == event.event_time == datetime(2026, 1, 2, 3, 4, 5, 123456,
                                                                    tzinfo=UTC)


def test_a_removal_is_dated_after_the_removed_generations_last_update():
    """fake-gcs-server stamps events to the second: a delete in the same second as the
    object's update must still be newer than the row a listing dated at that update."""
    data = json.dumps({"size": "1", "updated": "2026-01-02T03:04:05.9Z"}).encode()
    (rec,) = parse_message(message("OBJECT_DELETE", data=data)).records
    assert rec.event_time == datetime(2026, 1, 2, 3, 4, 5, 900001, tzinfo=UTC)
    (late,) = parse_message(message("OBJECT_DELETE")).records  # a later eventTime stays
    assert late.event_time == datetime(2026, 1, 2, 3, 4, 5, 500000, tzinfo=UTC)


@pytest.mark.parametrize("event_type", ["OBJECT_DELETE", "OBJECT_ARCHIVE"])
def test_delete_and_archive_are_removed(event_type):
    (rec,) = parse_message(message(event_type)).records
    assert rec.kind is EventKind.REMOVED and rec.size is None and rec.etag is None
    assert rec.sequencer == sequencer(7, removed=True)


@pytest.mark.parametrize("event_type", ["OBJECT_DELETE", "OBJECT_ARCHIVE"])
def test_the_old_half_of_an_overwrite_carries_nothing(event_type):
    """An overwrite publishes OBJECT_DELETE (OBJECT_ARCHIVE when versioned) of the old
    generation with overwrittenByGeneration: not a removal, or the directory table would
    write DELETE + INSERT instead of one UPDATE pair."""
    parsed = parse_message(message(event_type, overwrittenByGeneration="8"))
    assert parsed.records == () and parsed.skipped == 1
    (new,) = parse_message(message("OBJECT_FINALIZE", generation=8,
                                   overwroteGeneration="7")).records
    assert new.kind is EventKind.CREATED and new.version_id == "8"


def test_metadata_update_is_skipped():
    parsed = parse_message(message("OBJECT_METADATA_UPDATE"))
    assert parsed.records == () and parsed.skipped == 1 and parsed.event_type == \
        "OBJECT_METADATA_UPDATE"


@pytest.mark.parametrize(("older", "newer"), [
    (9, 10), (99, 100), (1, 1795804194576520), (1795804194576520, 1795804194580615),
    (999_999_999_999_999, 1_000_000_000_000_000), (2**62, 2**63 - 1)])
def test_generations_order_numerically_in_both_sequencer_rules(older, newer):
    """Generations are decimal ints of any length: compared as strings right-padded with
    zeros (AWS's rule, which the directory table applies), 9 would sort after 10."""
    seqs = [sequencer(older, removed=False), sequencer(older, removed=True),
            sequencer(newer, removed=False), sequencer(newer, removed=True)]
    for a, b in zip(seqs, seqs[1:], strict=False):
        assert compare_sequencers(a, b) == -1
    keys = sequencer_keys(pa.array(seqs))[0].to_pylist()
    assert keys == sorted(keys)


def test_bare_generations_would_misorder():
    """Why the sequencer pads: generation 9 against 10 as bare strings sorts 9 last."""
    assert compare_sequencers("9", "10") == 1
    assert compare_sequencers(sequencer(9, removed=True), sequencer(10, removed=False)) == -1


def test_payload_as_text_or_base64_as_rest_and_push_carry_it():
    raw = message()["data"]
    for data in (raw.decode(), base64.b64encode(raw).decode()):
        (rec,) = parse_message({**message(), "data": data}).records
        assert rec.size == 5


def test_composite_objects_without_md5_use_crc32c():
    assert etag_of(None, "yZRlqg==") == "crc32c-c99465aa"
    data = json.dumps({"size": "3", "crc32c": "yZRlqg=="}).encode()
    assert parse_message(message(data=data)).records[0].etag == "crc32c-c99465aa"


def test_names_are_verbatim_and_scope_filters():
    for key in ("in/a b+c%2B.txt", "in/ünï/çødé.txt"):
        (rec,) = parse_message(message(key=key)).records
        assert rec.key == key
    scope = GcsScope("bkt", "in/", recursive=False)
    assert to_file_event(parse_message(message(key="in/x/a.csv")).records[0], scope) is None
    assert to_file_event(parse_message(message(bucket="other")).records[0], scope) is None
    assert to_file_event(parse_message(message(key="out/a.csv")).records[0], scope) is None


@pytest.mark.parametrize(("msg", "match"), [
    ({"attributes": {}, "data": b"{}"}, "not a GCS notification"),
    ({"attributes": {"foo": "bar"}, "data": b"hello"}, "not a GCS notification"),
    ("not a message", "expected a Pub/Sub message"),
    (message("OBJECT_EXPLODED"), "unknown GCS eventType"),
    (message(generation="x7"), "is not a generation number"),
    (message(generation="-1"), "is not a generation number"),
    ({**message(), "attributes": {**message()["attributes"], "objectId": ""}}, "objectId"),
    ({**message(), "attributes": {**message()["attributes"], "payloadFormat": "NONE"}},
     "JSON_API_V1"),
    (message(data=b"{not json"), "not JSON"),
    (message(data=b"[1, 2]"), "not a JSON object"),
    (message(data="%%%"), "not JSON"),
    (message(size="-3"), "is not a count of bytes"),
    (message(data=json.dumps({"md5Hash": MD5}).encode()), "is not a count of bytes"),
    ({**message(), "attributes": {**message()["attributes"], "eventTime": "yesterday"}},
     "bad timestamp"),
])
def test_malformed_and_foreign_messages_raise_a_clear_error(msg, match):
    with pytest.raises(MalformedMessageError, match=match) as info:
        parse_message(msg, message_id="m9")
    assert "m9" in str(info.value)


def test_a_delete_needs_no_payload_size():
    (rec,) = parse_message(message("OBJECT_DELETE", data=b'{"name": "in/a.csv"}')).records
    assert rec.kind is EventKind.REMOVED
