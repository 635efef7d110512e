"""The MNS and OSS fakes answer the real SDKs as the services do (protocols.md §1, §2, §4)."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import base64
import json
import re
import threading
import time

import oss2
import pytest
from mns.account import Account
from mns.mns_exception import MNSServerException
from mns.queue import Message, QueueMeta

from tests.alicloud_fixtures import (  # noqa: F401
    FAKE_ACCESS_KEY_ID,
    FAKE_ACCESS_KEY_SECRET,
    make_volume,
    mns_server,
    oss_server,
    vol,
)


def drain(queue) -> list:
    """Every visible message of `queue` (raw bodies), received once."""
    queue.set_encoding(False)
    got = []
    while True:
        try:
            got += queue.batch_receive_message(16, wait_seconds=0)
        except MNSServerException as exc:
            assert exc.type == "MessageNotExist"
            return got


def events(queue) -> list[dict]:
    return [json.loads(base64.b64decode(m.message_body))["events"][0] for m in drain(queue)]


# -- MNS ------------------------------------------------------------------------------------------

def test_mns_rejects_wrong_secret_and_unknown_key(mns_server, vol):
    wrong = Account(mns_server.endpoint, FAKE_ACCESS_KEY_ID, "not-the-secret")
    wrong = wrong.get_queue(vol.queue_name)
    with pytest.raises(MNSServerException) as err:
        wrong.send_message(Message("x"))
    assert err.value.type == "SignatureDoesNotMatch"
    assert err.value.request_id and err.value.host_id == mns_server.endpoint
    unknown = Account(mns_server.endpoint, "LTAInobody", "x").get_queue(vol.queue_name)
    with pytest.raises(MNSServerException) as err:
        unknown.get_attributes()
    assert err.value.type == "InvalidAccessKeyId"
    assert mns_server.backend.messages(vol.queue_name) == []


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK's own, on QueueMeta
def test_mns_queue_lifecycle(mns_server):
    account = Account(mns_server.endpoint, FAKE_ACCESS_KEY_ID, FAKE_ACCESS_KEY_SECRET)
    queue = account.get_queue("lifecycle")
    assert queue.create(QueueMeta(vis_timeout=45, polling_wait_sec=3)).endswith("/queues/lifecycle")
    queue.create(QueueMeta(vis_timeout=45))  # same attributes: fine (204)
    with pytest.raises(MNSServerException, match="QueueAlreadyExist"):
        queue.create(QueueMeta(vis_timeout=46))
    meta = queue.get_attributes()
    assert meta.visibility_timeout == 45 and meta.polling_wait_seconds == 3
    assert meta.queue_name == "lifecycle"
    queue.delete()
    with pytest.raises(MNSServerException) as err:
        queue.get_attributes()
    assert err.value.type == "QueueNotExist"
    queue.mns_client.close_connection()


def test_mns_bodies_round_trip_base64_and_plain(vol):
    vol.queue.send_message(Message('{"k": "v é & <x>"}'))
    raw = vol.queue.peek_message()  # SDK default: base64 on the wire, decoded to bytes
    assert raw.message_body == '{"k": "v é & <x>"}'.encode()
    vol.queue.set_encoding(False)
    vol.queue.batch_send_message([Message("plain & <text>"), Message("second")])
    bodies = [m.message_body for m in drain(vol.queue)]
    assert bodies == [base64.b64encode('{"k": "v é & <x>"}'.encode()).decode(),
                      "plain & <text>", "second"]


def test_mns_visibility_handles_and_dequeue_count(mns_server, vol):
    vol.queue.send_message(Message("m"))
    first = vol.queue.receive_message(wait_seconds=0)
    assert first.dequeue_count == 1 and first.next_visible_time > first.enqueue_time
    with pytest.raises(MNSServerException, match="MessageNotExist"):
        vol.queue.receive_message(wait_seconds=0)  # invisible now
    mns_server.backend.advance(6)  # past the 5 s visibility timeout
    second = vol.queue.receive_message(wait_seconds=0)
    assert second.dequeue_count == 2 and second.receipt_handle != first.receipt_handle
    with pytest.raises(MNSServerException) as err:
        vol.queue.delete_message(first.receipt_handle)  # superseded by the re-receive
    assert err.value.type == "MessageNotExist"
    with pytest.raises(MNSServerException) as err:
        vol.queue.delete_message("never-issued")
    assert err.value.type == "ReceiptHandleError"
    changed = vol.queue.change_message_visibility(second.receipt_handle, 100)
    assert changed.receipt_handle != second.receipt_handle
    mns_server.backend.advance(50)
    with pytest.raises(MNSServerException, match="MessageNotExist"):
        vol.queue.change_message_visibility(second.receipt_handle, 10)
    vol.queue.delete_message(changed.receipt_handle)
    assert mns_server.backend.messages(vol.queue_name) == []


def test_mns_batch_delete_reports_each_failed_handle(vol):
    vol.queue.batch_send_message([Message("a"), Message("b")])
    got = vol.queue.batch_receive_message(16, wait_seconds=0)
    with pytest.raises(MNSServerException) as err:
        vol.queue.batch_delete_message([got[0].receipt_handle, "bogus", got[1].receipt_handle])
    assert err.value.type == "ReceiptHandleError"
    assert [e["ReceiptHandle"] for e in err.value.sub_errors] == ["bogus"]
    assert drain(vol.queue) == []  # the valid ones were deleted


def test_mns_long_poll_returns_when_a_message_arrives(mns_server, vol):
    vol.queue.set_encoding(False)
    sender = threading.Timer(0.3, lambda: mns_server.backend.send(vol.queue_name, "late"))
    sender.start()
    started = time.monotonic()
    got = vol.queue.batch_receive_message(16, wait_seconds=5)
    sender.join()
    assert [m.message_body for m in got] == ["late"]
    assert time.monotonic() - started < 3
    started = time.monotonic()
    with pytest.raises(MNSServerException, match="MessageNotExist"):
        vol.queue.receive_message(wait_seconds=1)
    assert 0.9 < time.monotonic() - started < 3


def test_mns_raw_receipt_handles_are_not_unquoted(mns_server, vol):
    """Handles go into the query string raw; '+' must stay '+' (spec §1.2)."""
    mns_server.backend.send(vol.queue_name, "x")
    vol.queue.set_encoding(False)
    msg = vol.queue.receive_message(wait_seconds=0)
    backend_queue = mns_server.backend.queues[vol.queue_name]
    odd = "AbC+d/e=="  # what a real service might mint
    backend_queue.issued[odd] = msg.message_id
    backend_queue.messages[msg.message_id].handle = odd
    vol.queue.delete_message(odd)
    assert mns_server.backend.messages(vol.queue_name) == []


def test_mns_injected_fault(mns_server, vol):
    mns_server.backend.fail_next("SendMessage", "InternalError", 500)
    with pytest.raises(MNSServerException, match="InternalError"):
        vol.queue.send_message(Message("x"))
    vol.queue.send_message(Message("x"))


# -- OSS ------------------------------------------------------------------------------------------

def test_oss_rejects_wrong_secret_and_unknown_key(oss_server, vol):
    wrong = oss2.Bucket(oss2.Auth(FAKE_ACCESS_KEY_ID, "nope"), oss_server.endpoint, vol.bucket)
    with pytest.raises(oss2.exceptions.OssError) as err:
        wrong.put_object("a.txt", b"x")
    assert (err.value.status, err.value.code) == (403, "SignatureDoesNotMatch")
    unknown = oss2.Bucket(oss2.Auth("LTAInobody", "x"), oss_server.endpoint, vol.bucket)
    with pytest.raises(oss2.exceptions.OssError) as err:
        unknown.get_object("a.txt")
    assert (err.value.status, err.value.code) == (403, "InvalidAccessKeyId")
    assert drain(vol.queue) == []


def test_oss_object_operations(vol):
    key = "dir/a b+c=d:é.txt"
    put = vol.oss.put_object(key, b"hello world")  # oss2 checks our CRC-64 header
    assert put.etag == "5EB63BBBE01EEED093CB22BB8F5ACDC3"
    assert vol.oss.get_object(key).read() == b"hello world"
    assert vol.oss.get_object(key, byte_range=(6, 10)).read() == b"world"
    # OSS ignores an out-of-range Range unless x-oss-range-behavior: standard
    assert vol.oss.get_object(key, byte_range=(6, 99)).read() == b"hello world"
    standard = {"x-oss-range-behavior": "standard"}
    assert vol.oss.get_object(key, byte_range=(6, 99), headers=standard).read() == b"world"
    with pytest.raises(oss2.exceptions.ServerError) as err:
        vol.oss.get_object(key, byte_range=(50, 60), headers=standard)
    assert (err.value.status, err.value.code) == (416, "InvalidRange")
    head = vol.oss.head_object(key)
    assert (head.content_length, head.content_type, head.etag) == (11, "text/plain", put.etag)
    assert vol.oss.object_exists(key) and not vol.oss.object_exists("nope")
    with pytest.raises(oss2.exceptions.NoSuchKey):
        vol.oss.head_object("nope")
    vol.oss.delete_object(key)
    vol.oss.delete_object(key)  # deleting a missing key is fine
    with pytest.raises(oss2.exceptions.NoSuchKey):
        vol.oss.get_object(key)


def test_oss_listing_v1_v2_pagination_and_delimiter(vol):
    keys = ["a.txt", "d/1.txt", "d/2.txt", "d/sub/3.txt", "d/sub/4.txt", "e/5.txt", "sp ace+é.txt"]
    for key in keys:
        vol.oss.put_object(key, b"x")
    assert [o.key for o in oss2.ObjectIteratorV2(vol.oss, max_keys=2)] == keys
    assert [o.key for o in oss2.ObjectIterator(vol.oss, max_keys=3)] == keys
    page = vol.oss.list_objects_v2(prefix="d/", delimiter="/", max_keys=2)
    assert page.is_truncated and [o.key for o in page.object_list] == ["d/1.txt", "d/2.txt"]
    page = vol.oss.list_objects_v2(prefix="d/", delimiter="/", max_keys=2,
                                   continuation_token=page.next_continuation_token)
    assert not page.is_truncated and page.prefix_list == ["d/sub/"] and page.object_list == []
    top = list(oss2.ObjectIteratorV2(vol.oss, delimiter="/", max_keys=1))
    assert [(o.key, o.is_prefix()) for o in top] == [
        ("a.txt", False), ("d/", True), ("e/", True), ("sp ace+é.txt", False)]
    listed = vol.oss.list_objects_v2(prefix="a").object_list[0]
    assert (listed.size, listed.type) == (1, "Normal")
    assert listed.etag == "9DD4E461268C8034F5C8564E155C67A6"


def test_oss_notifications(oss_server, vol):
    vol.oss.put_object("in/a.txt", b"hello")
    vol.oss.put_object("in/a.txt", b"hi")
    vol.oss.batch_delete_objects(["in/a.txt", "never-existed"])
    upload = vol.oss.init_multipart_upload("in/big.bin").upload_id
    parts = [oss2.models.PartInfo(n, vol.oss.upload_part("in/big.bin", upload, n, data).etag)
             for n, data in ((1, b"x" * 10), (2, b"y" * 5))]
    done = vol.oss.complete_multipart_upload("in/big.bin", upload, parts)
    first = vol.oss.append_object("in/log", 0, b"ab")
    vol.oss.append_object("in/log", first.next_position, b"cd")
    vol.oss.copy_object(vol.bucket, "in/log", "in/copy")
    vol.oss.delete_object("in/copy")
    got = events(vol.queue)
    summary = [(e["eventName"], e["oss"]["object"]["key"], e["oss"]["object"]["size"]) for e in got]
    assert summary == [
        ("ObjectCreated:PutObject", "in/a.txt", 5),
        ("ObjectCreated:PutObject", "in/a.txt", 2),
        ("ObjectRemoved:DeleteObjects", "in/a.txt", 0),
        ("ObjectCreated:CompleteMultipartUpload", "in/big.bin", 15),
        ("ObjectCreated:AppendObject", "in/log", 2),
        ("ObjectCreated:AppendObject", "in/log", 4),
        ("ObjectCreated:CopyObject", "in/copy", 4),
        ("ObjectRemoved:DeleteObject", "in/copy", 0),
    ]
    assert got[3]["oss"]["object"]["eTag"] == done.etag and done.etag.endswith("-2")
    assert got[1]["oss"]["object"]["deltaSize"] == -3
    assert got[0]["eventTime"].endswith(".000Z") and got[0]["oss"]["bucket"]["name"] == vol.bucket
    assert got[0]["eventSource"] == "acs:oss" and got[0]["oss"]["ruleId"] == vol.rule.rule_id


def test_oss_notification_rule_filters_and_plain_bodies(mns_server, oss_server):
    vol = make_volume(mns_server, oss_server, rule_prefix="in/", base64_body=False,
                      events=("ObjectCreated:*",), time_precision="ms")
    vol.oss.put_object("out/x", b"1")
    vol.oss.put_object("in/x", b"1")
    vol.oss.delete_object("in/x")
    upload = vol.oss.init_multipart_upload("in/m").upload_id
    vol.oss.abort_multipart_upload("in/m", upload)
    bodies = [m.message_body for m in drain(vol.queue)]
    names = [json.loads(b)["events"][0]["eventName"] for b in bodies]
    assert names == ["ObjectCreated:PutObject", "ObjectCreated:InitiateMultipartUpload"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z",
                        json.loads(bodies[0])["events"][0]["eventTime"])
    vol.close()
