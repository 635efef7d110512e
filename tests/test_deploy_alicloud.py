"""deploy/alicloud/ is valid and agrees with the code.

The files parse once their `${PLACEHOLDERS}` are filled in; the RAM policy grants exactly the
actions behind the SDK calls the code makes (found by scanning every module that imports
aliyun-mns-sdk or oss2, and mapped to RAM actions by the table below), scoped to one bucket
prefix and one queue; the queue set-up is within MNS's limits and fits the listener; the event
rule subscribes to exactly the events the MNS parser turns into changes. Last, the rendered
files drive a volume on the local MNS and OSS fakes.
"""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import ast
import fnmatch
import inspect
import json
import re
from pathlib import Path
from string import Template
from typing import Any

import oss2
import pytest
from mns.account import Account
from mns.mns_client import MNSClient
from mns.queue import Queue, QueueMeta

import volume_stream as vs
from connectors.alicloud.events import parse_message
from connectors.alicloud.listener import MnsListener
from connectors.alicloud.store import OssLister, OssReader, OssScope
from connectors.events import EventKind
from tests.alicloud_fixtures import (  # noqa: F401
    FAKE_ACCESS_KEY_ID,
    FAKE_ACCESS_KEY_SECRET,
    alicloud_env,
    mns_server,
    oss_server,
)
from tests.fakes.oss_server import DEFAULT_EVENTS

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "alicloud"
JSON_FILES = ["ram-policy.json", "ram-policy-inspect.json", "mns-queues.json",
              "oss-event-rule.json"]
VALUES = {"REGION": "cn-hangzhou", "ACCOUNT_ID": "1234567890123456", "BUCKET": "my-bucket",
          "PREFIX": "landing/", "QUEUE": "landing-events", "DEAD_LETTER_QUEUE": "landing-dlq"}

#: Every SDK method the code may call -> the RAM action the service authorises it with (None:
#: client-side only, no request). A call missing here fails `test_ram_policy_...`: look its
#: action up in the API reference, add it here and to ram-policy.json.
SDK_ACTIONS: dict[str, str | None] = {
    # aliyun-mns-sdk: mns.queue.Queue, mns.account.Account, mns.mns_client.MNSClient
    "receive_message": "mns:ReceiveMessage",
    "receive_message_with_str_body": "mns:ReceiveMessage",
    "batch_receive_message": "mns:BatchReceiveMessage",
    "batch_receive_message_with_str_body": "mns:BatchReceiveMessage",
    "delete_message": "mns:DeleteMessage",
    "batch_delete_message": "mns:BatchDeleteMessage",
    "change_message_visibility": "mns:ChangeMessageVisibility",
    "peek_message": "mns:PeekMessage",
    "batch_peek_message": "mns:BatchPeekMessage",
    "get_attributes": "mns:GetQueueAttributes",
    "set_encoding": None,
    "get_queue": None,
    "close_connection": None,
    # oss2.Bucket
    "get_object": "oss:GetObject",
    "head_object": "oss:GetObject",  # OSS authorises HEAD as GetObject
    "get_object_meta": "oss:GetObject",
    "list_objects": "oss:ListObjects",
    "list_objects_v2": "oss:ListObjects",  # V2 shares V1's action
}
SDK_SURFACE = {
    "mns": {n for c in (Queue, Account, MNSClient) for n in dir(c) if not n.startswith("_")},
    "oss2": {n for n in dir(oss2.Bucket) if not n.startswith("_")},
}
READ_ONLY_INSPECTION = {"mns:PeekMessage", "mns:BatchPeekMessage"}


def render(name: str, **values: str) -> Any:
    return json.loads(Template((DEPLOY / name).read_text()).substitute({**VALUES, **values}))


def sdk_calls() -> dict[str, set[str]]:
    """SDK method name -> the modules calling it, for every module importing an Alibaba SDK."""
    found: dict[str, set[str]] = {}
    for path in sorted(p for pkg in ("connectors", "volume_stream", "directory_table")
                       for p in (ROOT / pkg).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                     if isinstance(n, ast.ImportFrom) and n.module}
        surface = set().union(*(SDK_SURFACE[sdk] for sdk in SDK_SURFACE if sdk in imported))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in surface):
                found.setdefault(node.func.attr, set()).add(path.relative_to(ROOT).as_posix())
    return found


def actions_of(policy: dict) -> dict[str, list[dict]]:
    """Action -> the statements granting it."""
    out: dict[str, list[dict]] = {}
    for statement in policy["Statement"]:
        for action in statement["Action"]:
            out.setdefault(action, []).append(statement)
    return out


def test_files_parse_with_the_documented_placeholders():
    readme = (DEPLOY / "README.md").read_text()
    for name in JSON_FILES:
        text = (DEPLOY / name).read_text()
        used = set(re.findall(r"\$\{(\w+)\}", text))
        assert used <= set(VALUES), (name, used - set(VALUES))
        assert "$" not in json.dumps(render(name)), name  # every placeholder filled
        assert name in readme
    for placeholder in VALUES:
        assert f"${{{placeholder}}}" in readme or f"{placeholder}=" in readme, placeholder


def test_ram_policy_grants_exactly_the_actions_the_code_calls():
    calls = sdk_calls()
    assert {"batch_receive_message", "batch_delete_message", "get_object",
            "list_objects_v2"} <= set(calls), calls  # the scan sees the connectors
    unknown = set(calls) - set(SDK_ACTIONS)
    assert not unknown, f"SDK calls without a RAM action in SDK_ACTIONS: {sorted(unknown)}"
    needed = {SDK_ACTIONS[name] for name in calls} - {None}
    policy = render("ram-policy.json")
    assert policy["Version"] == "1"
    assert all(s["Effect"] == "Allow" for s in policy["Statement"])
    granted = actions_of(policy)
    assert set(granted) == needed, (sorted(set(granted) - needed), sorted(needed - set(granted)))
    assert not any("*" in action for action in granted)


def test_ram_policy_is_scoped_to_the_volume_and_its_queue():
    granted = actions_of(render("ram-policy.json"))
    bucket, prefix, region, account, queue = (VALUES[k] for k in (
        "BUCKET", "PREFIX", "REGION", "ACCOUNT_ID", "QUEUE"))
    (get,) = granted["oss:GetObject"]
    (listing,) = granted["oss:ListObjects"]
    assert get["Resource"] == [f"acs:oss:*:*:{bucket}/{prefix}*"]
    assert listing["Resource"] == [f"acs:oss:*:*:{bucket}"]
    assert listing["Condition"] == {"StringLike": {"oss:Prefix": [f"{prefix}*"]}}
    messages = f"acs:mns:{region}:{account}:/queues/{queue}/messages"
    for action, statements in granted.items():
        if action == "mns:GetQueueAttributes":  # the backlog gauge: the queue itself
            assert [s["Resource"] for s in statements] == [[messages.removesuffix("/messages")]]
        elif action.startswith("mns:"):
            assert [s["Resource"] for s in statements] == [[messages]], action

    # what the code asks for falls inside the grants (RAM's StringLike '*' is fnmatch's)
    endpoint = "https://oss-cn-hangzhou.aliyuncs.com"
    lister = OssLister(bucket, prefix.rstrip("/"), endpoint)
    assert fnmatch.fnmatchcase(lister.scope.prefix, listing["Condition"]["StringLike"][
        "oss:Prefix"][0])
    reader = OssReader(bucket, prefix, endpoint)
    arn = f"acs:oss:*:*:{bucket}/{reader.key('deep/a b+c.jpg')}"
    assert fnmatch.fnmatchcase(arn, get["Resource"][0])
    assert not fnmatch.fnmatchcase(f"acs:oss:*:*:{bucket}/other/a.jpg", get["Resource"][0])


def test_inspection_policy_is_read_only_and_not_needed_by_the_code():
    granted = actions_of(render("ram-policy-inspect.json"))
    assert set(granted) == READ_ONLY_INSPECTION
    assert not {SDK_ACTIONS[name] for name in sdk_calls()} & set(granted)
    queues = {VALUES["QUEUE"], VALUES["DEAD_LETTER_QUEUE"]}
    for statements in granted.values():
        for statement in statements:
            names = {re.search(r":/queues/([^/]+)", r).group(1) for r in statement["Resource"]}
            assert names == queues


MNS_LIMITS = {"VisibilityTimeout": (1, 43200), "MaximumMessageSize": (1024, 65536),
              "MessageRetentionPeriod": (60, 604800), "PollingWaitSeconds": (0, 30),
              "DelaySeconds": (0, 604800)}


def test_queue_setup_is_within_limits_and_fits_the_listener():
    queues = render("mns-queues.json")
    by_name = {q["QueueName"]: q for q in queues}
    assert list(by_name) == [VALUES["DEAD_LETTER_QUEUE"], VALUES["QUEUE"]]  # DLQ first
    for queue in queues:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]{0,255}", queue["QueueName"])
        assert set(queue) <= {"QueueName", "EnableLogging", "DlqPolicy", *MNS_LIMITS}
        for attr, (low, high) in MNS_LIMITS.items():
            assert low <= queue[attr] <= high, (queue["QueueName"], attr)
    main = by_name[VALUES["QUEUE"]]
    dlq = main["DlqPolicy"]
    assert dlq["Enabled"] is True and dlq["DeadLetterTargetQueue"] == VALUES["DEAD_LETTER_QUEUE"]
    assert dlq["MaxReceiveCount"] >= 2  # one failed attempt must not dead-letter a message
    assert "DlqPolicy" not in by_name[VALUES["DEAD_LETTER_QUEUE"]]
    # OSS notifications are ~1 KB; a 64 KB cap never drops one. Nothing is delayed.
    assert main["MaximumMessageSize"] == 65536 and main["DelaySeconds"] == 0
    # long enough for receive -> commit -> delete of a full batch; long polls as the listener
    assert main["VisibilityTimeout"] >= 60
    wait = inspect.signature(MnsListener).parameters["wait_seconds"].default
    assert main["PollingWaitSeconds"] == wait
    assert by_name[VALUES["DEAD_LETTER_QUEUE"]]["MessageRetentionPeriod"] >= \
        main["MessageRetentionPeriod"]


def _event(name: str) -> dict:
    created = name.startswith("ObjectCreated:")
    return {"events": [{"eventName": name, "eventSource": "acs:oss",
                        "eventTime": "2024-01-02T03:04:05.000Z",
                        "oss": {"bucket": {"name": VALUES["BUCKET"]},
                                "object": {"key": VALUES["PREFIX"] + "a.txt", "eTag": "AB",
                                           "size": 3 if created else 0}}}]}


def test_event_rule_subscribes_to_what_the_parser_commits():
    rule = render("oss-event-rule.json")
    assert rule["ProductName"] == "oss"
    assert rule["Endpoint"] == {"EndpointType": "queue", "EndpointValue": VALUES["QUEUE"]}
    scope = OssScope(VALUES["BUCKET"], VALUES["PREFIX"])
    assert rule["MatchRules"] == [[{"Prefix": f"{scope.bucket}/{scope.prefix}",
                                    "MatchState": True}]]
    types = rule["EventTypes"]
    assert len(types) == len(set(types))
    for name in types:
        (record,) = parse_message(json.dumps(_event(name))).records
        expected = EventKind.CREATED if name.startswith("ObjectCreated:") else EventKind.REMOVED
        assert record.kind is expected, name
    for step in ("ObjectCreated:InitiateMultipartUpload", "ObjectCreated:UploadPart",
                 "ObjectRemoved:AbortMultipartUpload"):  # carry nothing: not subscribed
        assert not parse_message(json.dumps(_event(step))).records and step not in types
    assert set(types) == set(DEFAULT_EVENTS)  # what the fakes deliver is what is deployed


@pytest.mark.filterwarnings("ignore:Call to deprecated function:DeprecationWarning")
def test_rendered_files_drive_a_volume_on_the_fakes(tmp_path, mns_server, oss_server,
                                                    alicloud_env):
    account = Account(mns_server.endpoint, FAKE_ACCESS_KEY_ID, FAKE_ACCESS_KEY_SECRET)
    for spec in render("mns-queues.json"):  # DlqPolicy needs the 2022 OpenAPI; not the fake
        meta = QueueMeta(vis_timeout=spec["VisibilityTimeout"],
                         max_msg_size=spec["MaximumMessageSize"],
                         msg_ttl=spec["MessageRetentionPeriod"], delay_sec=spec["DelaySeconds"],
                         polling_wait_sec=spec["PollingWaitSeconds"],
                         logging_enabled=spec["EnableLogging"])
        account.get_queue(spec["QueueName"]).create(meta)
        attrs = account.get_queue(spec["QueueName"]).get_attributes()
        assert attrs.visibility_timeout == spec["VisibilityTimeout"]
        assert attrs.polling_wait_seconds == spec["PollingWaitSeconds"]
    account.mns_client.close_connection()
    rule = render("oss-event-rule.json")
    bucket, _, prefix = rule["MatchRules"][0][0]["Prefix"].partition("/")
    oss = oss2.Bucket(oss2.Auth(FAKE_ACCESS_KEY_ID, FAKE_ACCESS_KEY_SECRET), oss_server.endpoint,
                      bucket)
    oss.create_bucket()
    oss_server.backend.add_notification_rule(bucket, rule["Endpoint"]["EndpointValue"],
                                             prefix=prefix, events=tuple(rule["EventTypes"]),
                                             rule_id=rule["RuleName"])
    cat = vs.connect(tmp_path / "warehouse")
    cat.create_volume("landing", f"oss://{bucket}/{prefix}", endpoint=oss_server.endpoint,
                      notification=vs.MnsNotification(mns_server.endpoint, VALUES["QUEUE"]))
    cat.create_stream("s", "landing")
    oss.put_object(prefix + "in.csv", b"a,b\n")
    oss.put_object("elsewhere/out.csv", b"x")  # outside the rule: never sent
    metrics = cat.watch("landing", until_idle=True, timeout=60, refresh=False)
    assert (metrics.received, metrics.ignored, metrics.versions) == (1, 0, [1])
    assert [(r["__change_type"], r["relative_path"]) for r in
            cat.read_stream_arrow("s").to_pylist()] == [("INSERT", "in.csv")]


@pytest.mark.parametrize("name", JSON_FILES)
def test_files_are_tidy(name):
    text = (DEPLOY / name).read_text()
    assert text.endswith("\n") and "\t" not in text
    json.loads(text)  # valid JSON even before rendering: placeholders sit inside strings
