"""The pure parser of Event Grid blob events on a Storage Queue (connectors.azure.events).

The documents are the examples of Microsoft's "Azure Blob Storage as an Event Grid source"
page, in both schemas it documents (Event Grid and CloudEvents 1.0), delivered as Event Grid
writes them to a queue: one event per message, its JSON base64-encoded.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest

from connectors.azure.events import parse_message, to_file_event
from connectors.azure.store import AzureScope
from connectors.errors import InvalidPathError, MalformedMessageError
from connectors.events import EventKind, compare_sequencers

TOPIC = ("/subscriptions/{subscription-id}/resourceGroups/Storage/providers/Microsoft.Storage/"
         "storageAccounts/my-storage-account")

#: the documented BlobCreated example, Event Grid schema
CREATED_EG = {
    "topic": TOPIC,
    "subject": "/blobServices/default/containers/test-container/blobs/new-file.txt",
    "eventType": "Microsoft.Storage.BlobCreated",
    "eventTime": "2017-06-26T18:41:00.9584103Z",
    "id": "831e1650-001e-001b-66ab-eeb76e069631",
    "data": {
        "api": "PutBlockList",
        "clientRequestId": "6d79dbfb-0e37-4fc4-981f-442c9ca65760",
        "requestId": "831e1650-001e-001b-66ab-eeb76e000000",
        "eTag": "\"0x8D4BCC2E4835CD0\"",
        "contentType": "text/plain",
        "contentLength": 524288,
        "blobType": "BlockBlob",
        "url": "https://my-storage-account.blob.core.windows.net/testcontainer/new-file.txt",
        "sequencer": "00000000000004420000000000028963",
        "storageDiagnostics": {"batchId": "b68529f3-68cd-4744-baa4-3c0498ec19f0"},
    },
    "dataVersion": "",
    "metadataVersion": "1",
}
#: the documented BlobDeleted example, CloudEvents 1.0 schema
DELETED_CE = {
    "source": TOPIC,
    "subject": "/blobServices/default/containers/testcontainer/blobs/file-to-delete.txt",
    "type": "Microsoft.Storage.BlobDeleted",
    "time": "2017-11-07T20:09:22.5674003Z",
    "id": "4c2359fe-001e-00ba-0e04-58586806d298",
    "data": {
        "api": "DeleteBlob",
        "requestId": "4c2359fe-001e-00ba-0e04-585868000000",
        "contentType": "text/plain",
        "blobType": "BlockBlob",
        "url": "https://my-storage-account.blob.core.windows.net/testcontainer/file-to-delete.txt",
        "sequencer": "0000000000000281000000000002F5CA",
        "storageDiagnostics": {"batchId": "b68529f3-68cd-4744-baa4-3c0498ec19f0"},
    },
    "specversion": "1.0",
}


def b64(doc) -> str:
    return base64.b64encode(json.dumps(doc).encode()).decode()


def test_the_documented_blob_created_event_in_the_event_grid_schema():
    parsed = parse_message(b64(CREATED_EG), message_id="m1")
    (record,) = parsed.records
    assert parsed.schema == "eventgrid" and parsed.message_id == "m1"
    assert (record.kind, record.account, record.bucket, record.key) == (
        EventKind.CREATED, "my-storage-account", "test-container", "new-file.txt")
    assert record.size == 524288 and record.etag == "0x8D4BCC2E4835CD0"  # unquoted
    assert record.sequencer == "00000000000004420000000000028963"
    assert record.event_time == datetime(2017, 6, 26, 18, 41, 0, 958410, tzinfo=UTC)
    assert record.event_name == "BlobCreated:PutBlockList"


def test_the_documented_blob_deleted_event_in_cloudevents():
    parsed = parse_message(b64(DELETED_CE))
    (record,) = parsed.records
    assert parsed.schema == "cloudevents"
    assert (record.kind, record.bucket, record.key, record.size, record.etag) == (
        EventKind.REMOVED, "testcontainer", "file-to-delete.txt", None, None)
    assert record.sequencer == "0000000000000281000000000002F5CA"


def test_plain_json_bytes_and_arrays_are_taken_too():
    assert parse_message(json.dumps(CREATED_EG)).records[0].key == "new-file.txt"
    assert parse_message(json.dumps(CREATED_EG).encode()).records[0].key == "new-file.txt"
    both = parse_message(b64([CREATED_EG, DELETED_CE]))
    assert [r.kind for r in both.records] == [EventKind.CREATED, EventKind.REMOVED]
    assert both.schema == "cloudevents+eventgrid"


def test_the_blob_name_comes_verbatim_from_the_subject_not_the_encoded_url():
    doc = json.loads(json.dumps(CREATED_EG))
    doc["subject"] = "/blobServices/default/containers/c/blobs/dir/a b+c%20é.txt"
    doc["data"]["url"] = "https://acct.blob.core.windows.net/c/dir/a%20b%2Bc%2520%C3%A9.txt"
    assert parse_message(b64(doc)).records[0].key == "dir/a b+c%20é.txt"
    del doc["subject"]  # no subject: the url, decoded
    assert parse_message(b64(doc)).records[0].key == "dir/a b+c%20é.txt"


def test_sequencers_are_upper_cased_hex_so_the_table_compares_them_as_strings():
    doc = json.loads(json.dumps(CREATED_EG))
    doc["data"]["sequencer"] = "000000000000000000000000000089a4"
    record = parse_message(b64(doc)).records[0]
    assert record.sequencer == "000000000000000000000000000089A4"
    # fixed width: the directory table's rule is plain string order, and a later hex digit
    # (A after 9) is newer
    assert compare_sequencers("0000000000000000000000000000000A",
                              "00000000000000000000000000000009") == 1
    doc["data"]["sequencer"] = "not-hex"
    with pytest.raises(MalformedMessageError, match="sequencer"):
        parse_message(b64(doc))


def test_an_adls_create_file_is_skipped_until_its_flush_with_close():
    doc = json.loads(json.dumps(CREATED_EG))
    doc["data"].update(api="CreateFile", contentLength=0, contentOffset=0,
                       url="https://acct.dfs.core.windows.net/fs/new-file.txt")
    parsed = parse_message(b64(doc))
    assert parsed.records == () and parsed.skipped == 1
    doc["data"].update(api="FlushWithClose", contentLength=12)
    assert parse_message(b64(doc)).records[0].size == 12


def test_events_that_change_no_content_are_skipped_not_malformed():
    for kind in ("BlobTierChanged", "AsyncOperationInitiated", "DirectoryCreated",
                 "BlobPropertiesUpdated"):
        doc = {**CREATED_EG, "eventType": f"Microsoft.Storage.{kind}"}
        parsed = parse_message(b64(doc))
        assert parsed.records == () and parsed.skipped == 1, kind


def test_adls_renames_and_directory_deletes_ask_for_a_refresh():
    doc = {**CREATED_EG, "eventType": "Microsoft.Storage.DirectoryDeleted",
           "subject": "/blobServices/default/containers/fs/blobs/in/day1",
           "data": {"api": "DeleteDirectory", "recursive": "true",
                    "url": "https://acct.dfs.core.windows.net/fs/in/day1",
                    "sequencer": "0000000000000281000000000002F5CA"}}
    parsed = parse_message(b64(doc))
    assert parsed.records == () and parsed.refresh == (("my-storage-account", "fs", "in/day1"),)


@pytest.mark.parametrize("body, match", [
    ("not base64 and not json", "neither JSON nor base64"),
    (base64.b64encode(b"\xff\xfe").decode(), "neither JSON nor base64"),
    ("{", "not JSON"),
    ('{"Records": []}', "not an Event Grid event"),
    ("[]", "empty array"),
    ("[1]", "must be a JSON object"),
    (json.dumps({**CREATED_EG, "eventType": "Microsoft.Resources.ResourceWriteSuccess"}),
     "not a storage event"),
    (json.dumps({**DELETED_CE, "specversion": "0.3"}), "specversion"),
    (json.dumps({**CREATED_EG, "data": {**CREATED_EG["data"], "contentLength": None}}),
     "contentLength"),
    (json.dumps({**CREATED_EG, "data": {**CREATED_EG["data"], "contentLength": -1}}),
     "not a count of bytes"),
    (json.dumps({**CREATED_EG, "eventTime": "yesterday"}), "bad timestamp"),
    (json.dumps({**CREATED_EG, "subject": "/x", "data": {**CREATED_EG["data"], "url": 3}}),
     "no blob"),
    (json.dumps({k: v for k, v in CREATED_EG.items() if k != "data"}), "missing field 'data'"),
], ids=["garbage", "base64-not-utf8", "truncated", "s3-shaped", "empty", "not-object",
        "foreign-event", "old-cloudevents", "no-size", "negative-size", "bad-time",
        "no-blob", "no-data"])
def test_malformed_and_foreign_messages_are_refused_naming_the_message(body, match):
    with pytest.raises(MalformedMessageError, match=match) as info:
        parse_message(body, message_id="msg-7")
    assert "msg-7" in str(info.value)


def test_to_file_event_keeps_the_volume_s_account_container_and_prefix():
    record = parse_message(b64(CREATED_EG)).records[0]
    scope = AzureScope("test-container", "", account="my-storage-account")
    event = to_file_event(record, scope, source_id="m")
    assert (event.relative_path, event.size, event.etag, event.sequencer, event.source_id) == (
        "new-file.txt", 524288, "0x8D4BCC2E4835CD0", "00000000000004420000000000028963", "m")
    assert to_file_event(record, AzureScope("test-container", "", account="other")) is None
    assert to_file_event(record, AzureScope("other", "")) is None
    assert to_file_event(record, AzureScope("test-container", "in/")) is None
    assert to_file_event(record, AzureScope("test-container", "")) is not None  # no account
    doc = {**CREATED_EG, "subject": "/blobServices/default/containers/test-container/blobs/a//b"}
    with pytest.raises(InvalidPathError):
        to_file_event(parse_message(b64(doc)).records[0], AzureScope("test-container"))
