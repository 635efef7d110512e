"""The shard API under random requests (hypothesis): random bodies (bytes, JSON, the operations'
members with good and bad values, deep nesting), targets, headers, Content-Lengths and methods,
written byte by byte to a running server, with and without keys. Every answer must be a
well-formed HTTP response under 500 carrying JSON (DynamoDB's error shape unless 200), never
a dropped connection, and the server must log no error nor print a traceback.

`make test` tries 30 inputs; `make soak` (HYPOTHESIS_PROFILE=soak) 3000 and prints a
SHARD-API-FUZZ line with the figures."""

from __future__ import annotations

import json
import logging
import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import volume_stream as vs
from tests.volume_stream.shard_http import TARGET, no_handlers_running, send, signed
from volume_stream.serve import ShardApiServer
from volume_stream.serve.dynamodb import OPERATIONS

SOAK = os.environ.get("HYPOTHESIS_PROFILE") == "soak"
KEYS = {"AKIDEXAMPLE": "secret-1"}
MEMBERS = ["TableName", "Limit", "ExclusiveStartStreamArn", "StreamArn", "ExclusiveStartShardId",
           "ShardFilter", "ShardId", "ShardIteratorType", "SequenceNumber", "ShardIterator",
           "Timestamp", "Type"]
HEADERS = ["Content-Length", "Transfer-Encoding", "X-Amz-Target", "Authorization", "Host",
           "X-Amz-Date", "X-Amz-Content-SHA256", "Content-Type", "Connection", "Expect"]

_latin = st.characters(min_codepoint=32, max_codepoint=255, blacklist_characters="\x7f")
header_value = st.text(_latin, max_size=60)
header_name = st.sampled_from(HEADERS) | st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,15}",
                                                        fullmatch=True)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)


def _world(tmp_path, ev):
    """A warehouse with a volume of a few records, and the values a good request names."""
    data = tmp_path / "data"
    data.mkdir()
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("vol", data, shards=2)
    cat.directory_table("vol").apply([ev.put(f"f{i}.txt", i + 1) for i in range(6)])
    log = cat.change_log("vol")
    good = [log.arn, "vol", "TRIM_HORIZON", "LATEST", "AT_SEQUENCE_NUMBER",
            "AFTER_SEQUENCE_NUMBER", "CHILD_SHARDS", 1, 100, 1000]
    for shard in log.shards():
        good.append(shard.shard_id)
        token = log.iterator(shard.shard_id, "TRIM_HORIZON")
        good.append(token)
        good += [r.sequence_number for r in log.get_records(token, 10).records]
    return cat, good


def _requests(good):
    member = st.sampled_from(good) | json_value
    body = st.one_of(
        st.binary(max_size=200),
        json_value.map(json.dumps),
        st.dictionaries(st.sampled_from(MEMBERS), member, max_size=5).map(json.dumps),
        st.tuples(st.sampled_from("[{"), st.integers(1, 120_000)).map(
            lambda t: t[0] * t[1] if t[0] == "[" else '{"a":' * t[1]),
    ).map(lambda b: b if isinstance(b, bytes) else b.encode("utf-8", "surrogatepass"))
    good_target = st.sampled_from([TARGET + op for op in OPERATIONS])
    target = st.one_of(good_target, good_target, good_target, header_value,
                       header_value.map(lambda t: TARGET + t))
    return st.fixed_dictionaries({
        "body": body, "target": target,
        "extra": st.lists(st.tuples(header_name, header_value), max_size=3),
        "length": st.none() | st.none() | header_value | st.integers(0, 2_000_000).map(str),
        "method": st.sampled_from(["POST"] * 20 + ["GET", "PUT", "HEAD", "DELETE", "BREW"]),
        "keyed": st.booleans(), "sign": st.booleans()})


def _fuzz(tmp_path, ev, capfd, caplog, examples):
    caplog.set_level(logging.INFO, logger="volume_stream")
    cat, good = _world(tmp_path, ev)
    seen: Counter[str] = Counter()
    with ShardApiServer(cat, "127.0.0.1", 0, client_timeout_s=5) as open_server, \
            ShardApiServer(cat, "127.0.0.1", 0, keys=KEYS, client_timeout_s=5) as keyed:

        @settings(max_examples=examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(req=_requests(good))
        def one(req):
            server = keyed if req["keyed"] else open_server
            headers = [("X-Amz-Target", req["target"])]
            if req["keyed"] and req["sign"] and req["target"].startswith(TARGET):
                headers = signed(server.url, req["target"][len(TARGET):], req["body"])
            answer = send(server.url, headers + req["extra"], req["body"],
                          method=req["method"], content_length=req["length"])
            seen["inputs"] += 1
            assert answer is not None and answer.status < 500, answer
            assert answer.headers["content-type"] == "application/x-amz-json-1.0"
            if req["method"] == "HEAD":
                seen["HEAD"] += 1
            elif answer.status == 200:
                assert isinstance(answer.doc, dict)
                seen["200"] += 1
            else:
                seen[answer.error] += 1

        one()
        no_handlers_running()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    tracebacks = capfd.readouterr().err.count("Traceback") + len(errors)
    kinds = {k: n for k, n in seen.most_common() if k not in ("inputs", "200", "HEAD")}
    print(f"\nSHARD-API-FUZZ: {seen['inputs']} inputs, {seen['200']} answered 200, "
          f"{seen['HEAD']} HEAD (no body), {sum(kinds.values())} clear errors ("
          f"{', '.join(f'{k} {n}' for k, n in kinds.items())}), dropped connections 0, "
          f"5xx 0, tracebacks {tracebacks}")
    assert tracebacks == 0, [r.getMessage() for r in errors]
    assert seen["inputs"] >= examples * 0.9


def test_fuzz_the_endpoint_briefly(tmp_path, ev, capfd, caplog):
    _fuzz(tmp_path, ev, capfd, caplog, 30)


@pytest.mark.soak
def test_fuzz_the_endpoint_soak(tmp_path, ev, capfd, caplog):
    _fuzz(tmp_path, ev, capfd, caplog, 3000)
