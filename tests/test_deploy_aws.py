"""deploy/aws/: the files parse, agree with each other, grant exactly the AWS actions the code
calls, and work when applied to moto's server (the bucket notification delivers to the queue a
volume watches; the redrive policy moves a poison message to the dead-letter queue).

The actions the code needs are derived, not listed: every boto3 operation name that appears in
connectors/aws/listener.py, connectors/aws/store.py and connectors/aws/client.py, and in the
provider-neutral bases connectors/_queue.py and connectors/_objects.py (as a client method call
or a string, e.g.
`get_paginator("list_objects_v2")`) is found with `ast`, attributed to the class that calls it,
and mapped to its IAM action by `IAM_ACTION` below. A new boto3 call without a mapping, an
action the code no longer calls, or a call the policies do not grant all fail here.
"""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import ast
import json
import uuid
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest
from botocore import xform_name

import volume_stream as vs
from tests.aws_fixtures import aws_env, moto_server  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "aws"
SOURCES = [REPO / "connectors" / "aws" / "listener.py", REPO / "connectors" / "aws" / "store.py",
           REPO / "connectors" / "aws" / "client.py", REPO / "connectors" / "_queue.py",
           REPO / "connectors" / "_objects.py"]

#: boto3 operation -> the IAM action that authorises it (the *Batch calls need the single one)
IAM_ACTION = {
    ("sqs", "receive_message"): "sqs:ReceiveMessage",
    ("sqs", "delete_message"): "sqs:DeleteMessage",
    ("sqs", "delete_message_batch"): "sqs:DeleteMessage",
    ("sqs", "change_message_visibility"): "sqs:ChangeMessageVisibility",
    ("sqs", "change_message_visibility_batch"): "sqs:ChangeMessageVisibility",
    ("sqs", "get_queue_attributes"): "sqs:GetQueueAttributes",
    ("sqs", "get_queue_url"): "sqs:GetQueueUrl",
    ("s3", "get_object"): "s3:GetObject",
    ("s3", "head_object"): "s3:GetObject",
    ("s3", "list_objects_v2"): "s3:ListBucket",
    ("s3", "list_objects"): "s3:ListBucket",
}

#: which principal runs the code of each class: the listener (watch + refresh) or the
#: pipeline readers (Spark executors)
ROLE = {"SqsListener": "listener", "S3Lister": "listener", "S3Reader": "reader"}
POLICY_FILE = {"listener": "listener-policy.json", "reader": "reader-policy.json"}

EXAMPLE = {"account": "111122223333", "region": "us-east-1", "bucket": "example-landing-bucket",
           "queue": "volume-stream-landing", "prefix": "landing/", "suffix": ".json"}


def load(name: str) -> Any:
    return json.loads((DEPLOY / name).read_text())


def operations() -> dict[str, set[str]]:
    """service -> its boto3 operation names (snake_case), from botocore's models."""
    session = botocore.session.get_session()
    return {service: {xform_name(op) for op in session.get_service_model(service).operation_names}
            for service in ("sqs", "s3")}


def calls_in(path: Path) -> set[tuple[str, str, str]]:
    """(top-level class or function, service, operation) for every boto3 operation named in
    the module, as an attribute (`client.receive_message(...)`) or a string constant."""
    ops = operations()
    found = set()
    for top in ast.parse(path.read_text()).body:
        scope = getattr(top, "name", "<module>")
        for node in ast.walk(top):
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                name = node.value
            else:
                continue
            services = [s for s, names in ops.items() if name in names]
            assert len(services) <= 1, f"{path.name}: {name!r} is an operation of {services}"
            if services:
                found.add((scope, services[0], name))
    return found


def code_actions() -> dict[str, set[str]]:
    """role -> the IAM actions its code needs."""
    needed: dict[str, set[str]] = {"listener": set(), "reader": set()}
    for path in SOURCES:
        for scope, service, op in calls_in(path):
            assert scope in ROLE, f"{path.name}: {scope} calls {service}.{op}; give it a ROLE"
            assert (service, op) in IAM_ACTION, f"{path.name}: map {service}.{op} in IAM_ACTION"
            needed[ROLE[scope]].add(IAM_ACTION[(service, op)])
    return needed


def statements(policy: dict) -> list[dict]:
    stmts = policy["Statement"]
    return stmts if isinstance(stmts, list) else [stmts]


def as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def policy_actions(policy: dict) -> set[str]:
    return {a for s in statements(policy) if s["Effect"] == "Allow" for a in as_list(s["Action"])}


# ------------------------------------------------------------------------- the files parse
def test_every_deploy_file_parses_and_is_documented():
    names = sorted(p.name for p in DEPLOY.glob("*.json"))
    assert names == sorted(["bucket-notification.json", "queue-policy.json",
                            "queue-attributes.json", "dead-letter-queue-attributes.json",
                            "listener-policy.json", "reader-policy.json"])
    readme = (DEPLOY / "README.md").read_text()
    for name in names:
        load(name)
        assert name in readme, f"deploy/aws/README.md does not mention {name}"


@pytest.mark.parametrize("name", ["queue-policy.json", "listener-policy.json",
                                  "reader-policy.json"])
def test_policies_are_well_formed(name):
    policy = load(name)
    assert policy["Version"] == "2012-10-17"
    for stmt in statements(policy):
        assert set(stmt) <= {"Sid", "Effect", "Principal", "Action", "Resource", "Condition"}
        assert stmt["Effect"] == "Allow" and stmt["Resource"] and stmt["Action"]
        assert all(":" in a and "*" not in a for a in as_list(stmt["Action"])), stmt
        assert all("*" not in r.split(":::")[-1].split("/")[0] for r in as_list(stmt["Resource"]))


def test_queue_attributes_carry_the_redrive_policy():
    attrs = load("queue-attributes.json")
    assert all(isinstance(v, str) for v in attrs.values())  # SQS attributes are strings
    redrive = json.loads(attrs["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == arn("queue") + "-dlq"
    assert 1 <= int(redrive["maxReceiveCount"]) <= 1000
    # long enough for a commit; the watcher extends it while a long batch commits
    assert int(attrs["VisibilityTimeout"]) >= 60
    allow = json.loads(load("dead-letter-queue-attributes.json")["RedriveAllowPolicy"])
    assert allow == {"redrivePermission": "byQueue", "sourceQueueArns": [arn("queue")]}


def arn(kind: str) -> str:
    e = EXAMPLE
    return {"queue": f"arn:aws:sqs:{e['region']}:{e['account']}:{e['queue']}",
            "bucket": f"arn:aws:s3:::{e['bucket']}"}[kind]


def test_the_files_agree_on_queue_bucket_and_prefix():
    (config,) = load("bucket-notification.json")["QueueConfigurations"]
    assert config["QueueArn"] == arn("queue")
    assert sorted(config["Events"]) == ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]
    rules = {r["Name"]: r["Value"] for r in config["Filter"]["Key"]["FilterRules"]}
    assert rules == {"prefix": EXAMPLE["prefix"], "suffix": EXAMPLE["suffix"]}

    (send,) = statements(load("queue-policy.json"))
    assert send["Principal"] == {"Service": "s3.amazonaws.com"}
    assert as_list(send["Action"]) == ["sqs:SendMessage"] and send["Resource"] == arn("queue")
    assert send["Condition"] == {"ArnLike": {"aws:SourceArn": arn("bucket")},
                                 "StringEquals": {"aws:SourceAccount": EXAMPLE["account"]}}

    listener = {s["Sid"]: s for s in statements(load("listener-policy.json"))}
    sqs_stmt = next(s for s in listener.values() if as_list(s["Action"])[0].startswith("sqs:"))
    assert sqs_stmt["Resource"] == arn("queue")
    list_stmt = next(s for s in listener.values() if "s3:ListBucket" in as_list(s["Action"]))
    assert list_stmt["Resource"] == arn("bucket")  # ListBucket is granted on the bucket...
    assert list_stmt["Condition"] == {"StringLike": {"s3:prefix": [EXAMPLE["prefix"] + "*"]}}
    (read,) = statements(load("reader-policy.json"))  # ...GetObject on the prefix's objects
    assert read["Resource"] == f"{arn('bucket')}/{EXAMPLE['prefix']}*"


# ------------------------------------------------------------- policies == what the code calls
def test_the_scan_finds_the_calls_we_know_about():
    sqs_calls = {(s, op) for _, s, op in calls_in(SOURCES[0])}
    s3_calls = {(scope, op) for scope, _, op in calls_in(SOURCES[1])}
    assert ("sqs", "receive_message") in sqs_calls and ("sqs", "delete_message_batch") in sqs_calls
    assert ("S3Lister", "list_objects_v2") in s3_calls  # a string: get_paginator("...")
    assert ("S3Reader", "get_object") in s3_calls  # open, resume and read_range all live there
    assert ("SqsListener", "get_queue_attributes") in {(sc, op) for sc, _, op in
                                                       calls_in(SOURCES[0])}


@pytest.mark.parametrize("role", ["listener", "reader"])
def test_policies_grant_exactly_the_actions_the_code_calls(role):
    needed = code_actions()[role]
    granted = policy_actions(load(POLICY_FILE[role]))
    assert needed, f"no AWS call found for the {role}"
    assert granted - needed == set(), f"{POLICY_FILE[role]} grants actions the code never calls"
    assert needed - granted == set(), f"{POLICY_FILE[role]} misses actions the code calls"


def test_the_reader_cannot_touch_the_queue_and_the_listener_cannot_read_objects():
    assert not any(a.startswith("sqs:") for a in policy_actions(load("reader-policy.json")))
    assert "s3:GetObject" not in policy_actions(load("listener-policy.json"))


# ------------------------------------------------------------------------- applied to moto
def localized(name: str, names: dict[str, str]) -> str:
    """The file's text with the example account, bucket and queue replaced (as the README's
    sed line does)."""
    text = (DEPLOY / name).read_text()
    for old, new in names.items():
        text = text.replace(old, new)
    return text


def test_the_files_work_on_moto(aws_env, tmp_path):
    kw = {"endpoint_url": aws_env, "region_name": "us-east-1"}
    s3, sqs, iam = (boto3.client(s, **kw) for s in ("s3", "sqs", "iam"))
    unique = uuid.uuid4().hex[:10]
    # the queue name is replaced as a prefix of the DLQ's, just as sed would
    names = {EXAMPLE["account"]: "123456789012", EXAMPLE["bucket"]: f"bkt-{unique}",
             EXAMPLE["queue"]: f"q-{unique}"}
    bucket, queue = names[EXAMPLE["bucket"]], names[EXAMPLE["queue"]]
    s3.create_bucket(Bucket=bucket)
    dlq_url = sqs.create_queue(QueueName=f"{queue}-dlq", Attributes=json.loads(
        localized("dead-letter-queue-attributes.json", names)))["QueueUrl"]
    attributes = json.loads(localized("queue-attributes.json", names))
    attributes["VisibilityTimeout"] = "0"  # let the test see redelivery at once
    queue_url = sqs.create_queue(QueueName=queue, Attributes=attributes)["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={
        "Policy": localized("queue-policy.json", names)})
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration=json.loads(
        localized("bucket-notification.json", names)))
    for role, name in POLICY_FILE.items():  # moto validates IAM policy documents
        iam.create_policy(PolicyName=f"volume-stream-{role}-{unique}",
                          PolicyDocument=localized(name, names))
    sqs.purge_queue(QueueUrl=queue_url)  # the s3:TestEvent

    cat = vs.connect(tmp_path / "warehouse")
    cat.create_volume("landing", f"s3://{bucket}/{EXAMPLE['prefix']}", include="*.json",
                      notification=vs.SqsNotification(queue_url, wait_time_seconds=0))
    cat.create_stream("s", "landing")
    for key in ("landing/a.json", "landing/b.csv", "elsewhere/c.json"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"{}")
    assert queue_counts_of(sqs, queue_url) == (1, 0)  # the filter let one event through
    assert cat.watch("landing", until_idle=True, timeout=60, refresh=False).versions == [1]
    assert [r["relative_path"] for r in cat.read_stream_arrow("s").to_pylist()] == ["a.json"]

    # a poison message is received maxReceiveCount times, then moves to the dead-letter queue
    sqs.send_message(QueueUrl=queue_url, MessageBody="not an S3 event")
    max_receive = int(json.loads(attributes["RedrivePolicy"])["maxReceiveCount"])
    for _ in range(max_receive):
        assert sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=0).get("Messages")
    m = cat.watch("landing", until_idle=True, timeout=60, refresh=False)
    assert (m.malformed, m.versions) == (0, [])
    assert queue_counts_of(sqs, queue_url) == (0, 0)
    (dead,) = sqs.receive_message(QueueUrl=dlq_url, WaitTimeSeconds=0)["Messages"]
    assert dead["Body"] == "not an S3 event"
    for url in (queue_url, dlq_url):
        sqs.delete_queue(QueueUrl=url)


def queue_counts_of(sqs: Any, queue_url: str) -> tuple[int, int]:
    attrs = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]), int(
        attrs["ApproximateNumberOfMessagesNotVisible"])
