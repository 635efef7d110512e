"""Shards over a volume's change log: shards, iterators, records (issue 15, Python API)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import threading

import pytest

import volume_stream as vs
from volume_stream.shards import ChangeLog, list_change_logs
from volume_stream.shards.iterators import ITERATOR_TTL_S, IteratorSigner


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "wh")


@pytest.fixture
def vol(cat, data_dir):
    cat.create_volume("vol", data_dir)
    return "vol"


def apply(cat, *events, volume="vol"):
    return cat.directory_table(volume).apply(events).version


def drain(log, shard_id, kind="TRIM_HORIZON", limit=1000, **kw):
    """Every record of a shard from `kind` until it is drained (closed) or empty (open)."""
    it, out = log.iterator(shard_id, kind, **kw), []
    while it:
        page = log.get_records(it, limit=limit)
        out += page.records
        if not page.records and page.next_iterator and not _closed(log, shard_id):
            return out, page.next_iterator
        it = page.next_iterator
    return out, None


def _closed(log, shard_id):
    return next(s for s in log.shards() if s.shard_id == shard_id).closed


def read_all(log, limit=1000):
    """Every record of every shard, parents first (the lineage order a consumer must keep)."""
    done, out = set(), []
    shards = log.shards()
    while len(done) < len(shards):
        for s in shards:
            if s.shard_id in done:
                continue
            if any(p and p not in done and p in {x.shard_id for x in shards}
                   for p in (s.parent_shard_id, s.parent_sibling_shard_id)):
                continue
            out += drain(log, s.shard_id, limit=limit)[0]
            done.add(s.shard_id)
    return out


def test_default_log_arn_shard_and_records(cat, vol, ev):
    apply(cat, ev.put("a.txt", 1), ev.put("b.txt", 2))          # v1
    apply(cat, ev.put("a.txt", 5))                                # v2 overwrite
    apply(cat, ev.rm("b.txt"))                                    # v3 delete
    log = cat.change_log(vol)
    assert re.fullmatch(r"arn:aws:dynamodb:us-east-1:000000000000:table/vol/stream/"
                        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}", log.arn)
    (shard,) = log.shards()
    assert re.fullmatch(r"shardId-\d+-[0-9a-f]+", shard.shard_id)
    assert 28 <= len(shard.shard_id) <= 65
    assert shard.parent_shard_id is None and shard.ending_sequence_number is None
    records, _ = drain(log, shard.shard_id)
    assert [(r.event_name, r.key["relative_path"], r.commit_version) for r in records] == [
        ("INSERT", "a.txt", 1), ("INSERT", "b.txt", 1), ("MODIFY", "a.txt", 2),
        ("REMOVE", "b.txt", 3)]
    seqs = [r.sequence_number for r in records]
    assert all(s.isdigit() and 21 <= len(s) <= 40 for s in seqs)
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    ins, mod, rem = records[0], records[2], records[3]
    assert ins.old_image is None and ins.new_image["size"] == 1
    assert set(ins.new_image) == {"relative_path", "url", "size", "last_modified_time", "etag"}
    assert mod.old_image["size"] == 1 and mod.new_image["size"] == 5
    assert rem.old_image["size"] == 2 and rem.new_image is None
    history = {h["version"]: h["timestamp"] for h in cat.history(vol)}
    assert all(r.commit_timestamp == history[r.commit_version] for r in records)
    assert {r.shard_id for r in records} == {shard.shard_id}


def test_account_and_region_configurable(cat, vol):
    log = cat.change_log(vol, region="eu-west-1", account_id="123456789012")
    assert log.arn.startswith("arn:aws:dynamodb:eu-west-1:123456789012:table/vol/stream/")
    with pytest.raises(vs.InvalidInputError):
        cat.change_log(vol, account_id="12")


def test_paging_latest_and_sequence_positions(cat, vol, ev):
    apply(cat, *[ev.put(f"f{i:02d}.txt") for i in range(7)])    # v1: 7 records
    log = cat.change_log(vol)
    sid = log.shards()[0].shard_id
    latest = log.iterator(sid, "LATEST")
    page = log.get_records(log.iterator(sid, "TRIM_HORIZON"), limit=3)
    assert [r.key["relative_path"] for r in page.records] == ["f00.txt", "f01.txt", "f02.txt"]
    rest = log.get_records(page.next_iterator, limit=1000)
    assert [r.key["relative_path"] for r in rest.records] == [f"f{i:02d}.txt" for i in range(3, 7)]
    assert rest.next_iterator is not None                   # an open shard always continues
    assert log.get_records(rest.next_iterator).records == []
    assert log.get_records(latest).records == []            # nothing after LATEST yet
    apply(cat, ev.put("g.txt"))                             # v2
    assert [r.key["relative_path"] for r in log.get_records(latest).records] == ["g.txt"]
    assert [r.key["relative_path"] for r in
            log.get_records(rest.next_iterator).records] == ["g.txt"]
    seq = page.records[1].sequence_number
    at = log.get_records(log.iterator(sid, "AT_SEQUENCE_NUMBER", sequence_number=seq), limit=2)
    after = log.get_records(log.iterator(sid, "AFTER_SEQUENCE_NUMBER", sequence_number=seq),
                            limit=2)
    assert [r.key["relative_path"] for r in at.records] == ["f01.txt", "f02.txt"]
    assert [r.key["relative_path"] for r in after.records] == ["f02.txt", "f03.txt"]
    with pytest.raises(vs.InvalidInputError):
        log.iterator(sid, "AT_SEQUENCE_NUMBER")
    with pytest.raises(vs.InvalidInputError):
        log.iterator(sid, "SOMEWHERE")
    with pytest.raises(vs.InvalidInputError):
        log.iterator(sid, "AT_SEQUENCE_NUMBER", sequence_number="12x")
    with pytest.raises(vs.NotFoundError):
        log.iterator("shardId-00000000000000000000-deadbeef", "LATEST")


def test_noop_rewrite_is_no_record_and_view_types(cat, data_dir, ev):
    cat.create_volume("kv", data_dir)
    apply(cat, ev.put("a.txt", 1), volume="kv")
    cat.disable_change_log("kv")
    for view in ("KEYS_ONLY", "NEW_IMAGE", "OLD_IMAGE"):
        log = cat.enable_change_log("kv", view_type=view)
        assert log.view_type == view and log.enabled
        apply(cat, ev.put("a.txt", {"KEYS_ONLY": 2, "NEW_IMAGE": 3, "OLD_IMAGE": 4}[view]),
              volume="kv")
        (r,) = drain(log, log.shards()[0].shard_id)[0]
        assert r.event_name == "MODIFY" and r.key == {"relative_path": "a.txt"}
        assert (r.old_image is not None) == (view == "OLD_IMAGE")
        assert (r.new_image is not None) == (view == "NEW_IMAGE")
        cat.disable_change_log("kv")
    with pytest.raises(vs.InvalidInputError):
        cat.enable_change_log("kv", view_type="ALL")


def test_disable_closes_shards_and_reenable_makes_new_stream(cat, vol, ev):
    apply(cat, ev.put("a.txt"))
    old = cat.change_log(vol)
    cat.disable_change_log(vol)
    with pytest.raises(vs.InvalidInputError):
        cat.disable_change_log(vol)
    apply(cat, ev.put("b.txt"))                       # not in any stream: the log is off
    new = cat.enable_change_log(vol)
    with pytest.raises(vs.InvalidInputError):
        cat.enable_change_log(vol)
    apply(cat, ev.put("c.txt"))
    assert new.label != old.label and new.arn != old.arn
    old = cat.change_log(vol, label=old.label)
    assert not old.enabled and all(s.closed for s in old.shards())
    assert [r.key["relative_path"] for r in read_all(old)] == ["a.txt"]
    assert [r.key["relative_path"] for r in read_all(new)] == ["c.txt"]
    assert [label for _, label in list_change_logs(cat, vol)] == [old.label, new.label]


def test_forged_altered_and_expired_iterators(cat, vol, ev):
    apply(cat, ev.put("a.txt"))
    log = cat.change_log(vol)
    it = log.iterator(log.shards()[0].shard_id, "TRIM_HORIZON")
    body, mac = it.split(".")
    for bad in ("nonsense", it + "x", body[:-2] + "AA." + mac, "." + mac, 42):
        with pytest.raises(vs.ExpiredIteratorError):
            log.get_records(bad)
    # a token signed by another warehouse's key is not ours
    other = vs.connect(log.catalog.warehouse.root.parent / "other")
    other.create_volume("vol", log.spec.location)
    foreign = other.change_log("vol")
    with pytest.raises(vs.ExpiredIteratorError):
        log.get_records(foreign.iterator(foreign.shards()[0].shard_id, "TRIM_HORIZON"))
    # 15 minutes on, the same token has expired; a fresh one works
    later = ChangeLog(cat, vol, clock=lambda: log.clock() + 15 * 60 + 1)
    with pytest.raises(vs.ExpiredIteratorError) as err:
        later.get_records(it)
    assert "expired" in str(err.value)
    assert len(later.get_records(later.iterator(log.shards()[0].shard_id,
                                                "TRIM_HORIZON")).records) == 1


def test_an_issued_iterator_is_known_and_still_expires(cat):
    signer = IteratorSigner(cat.warehouse.location)
    token = signer.sign({"shard": "s", "pos": [3, 7]}, issued_at=1000.0)
    fresh = IteratorSigner(cat.warehouse.location)  # the same key, nothing remembered
    assert signer.verify(token, 1001.0) == fresh.verify(token, 1001.0) == {
        "shard": "s", "pos": [3, 7], "iat": 1000.0}
    for s in (signer, fresh):
        with pytest.raises(vs.ExpiredIteratorError, match="expired"):
            s.verify(token, 1000.0 + ITERATOR_TTL_S + 1)


def test_a_position_token_is_the_token_sign_makes(cat):
    """`sign_position` (a JSON template per set of fields, the HMAC from pads hashed once) makes
    the token `sign` makes, with the MAC the standard library's HMAC-SHA256 computes."""
    signer = IteratorSigner(cat.warehouse.location)
    for fields in ({"vid": "v", "vol": "b", "label": "2026", "shard": "s-1"},
                   {"vol": 'quo"te %d %% \\ é 雪', "shard": "", "a": "%r", "z": "pos"}):
        for pos, at in (((3, 7), 1000.0), ((0, 2**40), 1764150000.1236), ((12, 0), 0.5)):
            token = signer.sign_position(fields, pos, at)
            assert token == signer.sign({**fields, "pos": list(pos)}, at)
            body, mac = (base64.urlsafe_b64decode(p + "=" * (-len(p) % 4))
                         for p in token.split("."))
            assert mac == hmac.new(signer._key, body, hashlib.sha256).digest()
            assert IteratorSigner(cat.warehouse.location).verify(token, at + 1) == {
                **fields, "pos": list(pos), "iat": round(at, 3)}


def test_trimmed_after_retention(cat, data_dir, ev):
    cat.create_volume("short", data_dir, data_retention_days=0)
    log = cat.change_log("short")
    sid = log.shards()[0].shard_id
    apply(cat, ev.put("a.txt"), volume="short")
    held = log.iterator(sid, "TRIM_HORIZON")
    first = log.get_records(log.iterator(sid, "TRIM_HORIZON")).records[0]
    for i in range(3):
        apply(cat, ev.put(f"f{i}.txt"), volume="short")
    assert cat.apply_retention("short")["oldest_version"] == 4
    with pytest.raises(vs.TrimmedDataError):
        log.get_records(held)
    with pytest.raises(vs.TrimmedDataError):
        log.iterator(sid, "AT_SEQUENCE_NUMBER", sequence_number=first.sequence_number)
    assert log.get_records(log.iterator(sid, "TRIM_HORIZON")).records == []
    apply(cat, ev.put("late.txt"), volume="short")
    assert [r.key["relative_path"] for r in
            log.get_records(log.iterator(sid, "TRIM_HORIZON")).records] == ["late.txt"]


def test_create_volume_with_shards_spreads_keys(cat, data_dir, ev):
    cat.create_volume("wide", data_dir, shards=4)
    paths = [f"d/{i}.bin" for i in range(60)]
    apply(cat, *[ev.put(p) for p in paths], volume="wide")
    log = cat.change_log("wide")
    shards = log.shards()
    assert len(shards) == 4 and len({s.shard_id for s in shards}) == 4
    per_shard = [drain(log, s.shard_id)[0] for s in shards]
    assert all(per_shard)                                   # 60 keys land in every shard
    assert sorted(r.key["relative_path"] for rs in per_shard for r in rs) == sorted(paths)
    with pytest.raises(vs.InvalidInputError):
        cat.create_volume("bad", data_dir, shards=0)


def test_reshard_lineage_and_full_history_once_in_order(cat, data_dir, ev):
    cat.create_volume("rs", data_dir, shards=2)
    keys = [f"k{i}" for i in range(24)]
    apply(cat, *[ev.put(k, 1) for k in keys], volume="rs")
    children = cat.reshard("rs", 4)                          # split: each child has one parent
    log = cat.change_log("rs")
    parents = {s.shard_id for s in log.shards() if s.closed}
    assert len(parents) == 2 and all(c.parent_shard_id in parents for c in children)
    assert all(c.parent_sibling_shard_id is None for c in children)
    apply(cat, *[ev.put(k, 2) for k in keys[:12]], volume="rs")
    merged = cat.reshard("rs", 2)                            # merge: parent + sibling
    assert all(m.parent_sibling_shard_id for m in merged)
    apply(cat, *[ev.rm(k) for k in keys[::3]], volume="rs")
    with pytest.raises(vs.InvalidInputError):
        cat.reshard("rs", 0)
    records = read_all(cat.change_log("rs"), limit=5)
    by_key = {}
    for r in records:
        by_key.setdefault(r.key["relative_path"], []).append((r.event_name, r.commit_version))
    for i, k in enumerate(keys):
        expected = [("INSERT", 1)] + ([("MODIFY", 2)] if i < 12 else []) \
            + ([("REMOVE", 3)] if i % 3 == 0 else [])
        assert by_key[k] == expected, k
    closed = [s for s in cat.change_log("rs").shards() if s.closed]
    assert all(s.ending_sequence_number > s.starting_sequence_number for s in closed)


def test_reshard_under_concurrent_writes(cat, data_dir, ev):
    cat.create_volume("busy", data_dir, shards=1)
    events = [ev.put(f"w{i:03d}") for i in range(40)]
    stop, written = threading.Event(), []

    def writer():
        for e in events:
            written.append(cat.directory_table("busy").apply([e]).version)
        stop.set()

    t = threading.Thread(target=writer, name="volume-stream-test-writer")
    t.start()
    n = 1
    while not stop.is_set() and n < 8:
        n *= 2
        cat.reshard("busy", n)
    t.join(60)
    records = read_all(cat.change_log("busy"), limit=7)
    assert sorted(r.key["relative_path"] for r in records) == [f"w{i:03d}" for i in range(40)]
    assert all(r.event_name == "INSERT" for r in records)


def test_reshard_left_half_done_is_finished_by_a_reader(cat, data_dir, ev):
    """A reshard process that died after committing its intent (step 1) but before closing
    the shards (step 2): the next reader closes them at a version it reads then, so records
    written meanwhile are read once, from the children."""
    from volume_stream.shards.meta import CHANGE_LOG

    cat.create_volume("half", data_dir, shards=1)
    apply(cat, ev.put("a"), volume="half")
    log = cat.change_log("half")
    (sid,) = [s.shard_id for s in log.shards()]
    it = log.iterator(sid, "TRIM_HORIZON")

    def intent(state):
        state[(CHANGE_LOG, "half")]["streams"][-1]["closing"] = {"shards": 2}

    cat.warehouse.mutate(intent)
    apply(cat, ev.put("b"), ev.put("c"), volume="half")       # after the intent
    page = log.get_records(it)
    shards = log.shards()
    assert len(shards) == 3 and shards[0].closed and shards[0].end_version == 2
    assert sorted(r.key["relative_path"] for r in page.records) == ["a", "b", "c"]
    assert page.next_iterator is None                        # the parent is drained
    apply(cat, ev.put("d"), volume="half")
    assert sorted(r.key["relative_path"] for r in read_all(cat.change_log("half"))) == [
        "a", "b", "c", "d"]


def test_log_over_a_pre_bucket_table_survives_its_migration(cat, data_dir, ev):
    import shutil
    from pathlib import Path

    from tests.directory_table.test_maintenance import create_legacy

    cat.create_volume("legacy", data_dir)
    root = Path(cat.directory_table("legacy").root)
    shutil.rmtree(root)
    create_legacy(root, base_url=cat.volume_spec("legacy").location)
    apply(cat, ev.put("a"), ev.put("b"), volume="legacy")
    log = cat.change_log("legacy")
    assert log.meta["buckets"] == 1 and len(log.shards()) == 1
    cat.directory_table("legacy").migrate(buckets=8)
    apply(cat, ev.put("a", 2), ev.put("c"), volume="legacy")
    got = [(r.event_name, r.key["relative_path"]) for r in read_all(cat.change_log("legacy"))]
    assert got == [("INSERT", "a"), ("INSERT", "b"), ("MODIFY", "a"), ("INSERT", "c")]


def test_pairing_of_a_version_merges_delete_insert_and_drops_noops():
    """`shard_window` over a change feed as Delta writes it for a rewrite: delete + insert of
    one key in one version is one MODIFY, and none when no public column changed."""
    from datetime import UTC, datetime

    import pyarrow as pa

    from directory_table.layout import Layout
    from directory_table.table import _CDF_SCHEMA
    from volume_stream.shards.model import Shard
    from volume_stream.shards.pages import window_records
    from volume_stream.shards.reader import shard_window

    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def row(path, size, kind, version):
        return {"relative_path": path, "url": f"file:///d/{path}", "size": size,
                "last_modified_time": t0, "etag": f"e{size}", "_sequencer": None,
                "_event_time": t0, "_image_version": version, "_image_timestamp": t0,
                "_change_type": kind, "_commit_version": version, "_bucket": 0}

    cdf = pa.Table.from_pylist([
        row("same", 1, "insert", 2), row("same", 1, "delete", 2),          # no-op rewrite
        row("b", 4, "update_postimage", 3), row("b", 3, "update_preimage", 3),
        row("gone", 5, "delete", 3)], _CDF_SCHEMA)                         # in any order

    class Table:
        def changes(self, after, up_to, buckets=None, columns=None):
            return cdf

        def layout(self):
            return Layout(buckets=1, bucketed=True)

    shard = Shard("shardId-00000000000000000000-00000000", None, None, "1", None)
    window = shard_window(Table(), shard, 1, 3)
    recs = window_records(window, 0, len(window), shard, "NEW_AND_OLD_IMAGES", lambda v: t0)
    assert [(r.event_name, r.key["relative_path"], r.commit_version, r.sequence_number[-2:])
            for r in recs] == [("MODIFY", "b", 3, "00"), ("REMOVE", "gone", 3, "01")]
    assert recs[0].old_image["size"] == 3 and recs[0].new_image["size"] == 4
    assert window.after(3, 0) == 1 and window.after(2, 9_999_999_999) == 0
