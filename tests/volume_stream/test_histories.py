"""Random histories against an oracle (issue 16): a hypothesis state machine writes, overwrites,
renames, touches and deletes files with odd names in a real folder, refreshes the volume, and
creates and consumes STANDARD and APPEND_ONLY streams (with and without initial rows, the
consumer's block succeeding or raising). Some histories keep the volume current with a refresh
after changes, others with the local listener (real inotify, drained through the volume's
`VolumeWatcher` as `Catalog.watch` does, until the listener is idle and the table holds the
folder; a refresh then must change nothing: listener and refresh agree). Every result is checked against an oracle computed from
snapshots of the folder alone:

* the directory table after a refresh = the folder's listing (unsafe names left out, counted);
* STANDARD = the minimal per-file diff between the offset's snapshot and the latest;
* APPEND_ONLY = every appearance of a path in a version of the range;
* the offset and batch id move only when the block succeeds; a retry after a failure sees
  exactly the range pinned first (DESIGN §5).

With the listener a change of the folder may take several commits (a rename: a delete and a
create); the oracle's versions are then the table's versions at the end of each drain, and a
record's commit version is compared as the drain that wrote it.

Arrow read path only (no Spark), so a history costs a few Delta commits per step. Profiles:
`fast` (default, part of `make test`) and `soak` (`make soak`: HYPOTHESIS_PROFILE=soak).
"""

from __future__ import annotations

import bisect
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

import volume_stream as vs

settings.register_profile("fast", max_examples=30, stateful_step_count=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("soak", max_examples=400, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

#: safe odd names (spaces, non-ASCII, URL characters, hidden files, nesting)
SAFE = ["a.txt", "b b.txt", "ü-名.bin", "c+d%20e.txt", ".hidden", "deep/x.txt",
        "deep/er/y z.txt", "deep/er/#q?.txt"]
#: names a volume cannot hold as keys: skipped by refresh and counted as invalid
UNSAFE = ["back\\slash.txt", "new\nline.txt", "tab\there.txt"]
NAMES = SAFE + UNSAFE

Image = tuple[int, str]  # (size, etag) as the local lister reports them


class StreamModel:
    def __init__(self, mode: str, offset: int, initial: bool):
        self.mode, self.offset, self.initial = mode, offset, initial
        self.batch_id = 0
        self.pinned: int | None = None  # end version of a failed batch, retried exactly


@dataclass
class Oracle:
    #: per version: path -> (image, version that wrote the image)
    versions: list[dict[str, tuple[Image, int]]] = field(default_factory=lambda: [{}])

    @property
    def latest(self) -> int:
        return len(self.versions) - 1

    def commit(self, listing: dict[str, Image]) -> int | None:
        """What a refresh of `listing` makes: a new version if any image changed."""
        current = self.versions[-1]
        if {p: i for p, (i, _) in current.items()} == listing:
            return None
        v = len(self.versions)
        self.versions.append({p: (img, current[p][1] if p in current and current[p][0] == img
                                  else v) for p, img in listing.items()})
        return v

    def records(self, s: StreamModel, a: int, b: int) -> list[tuple]:
        """(change_type, path, size, etag, commit_version) the stream shows for (a, b]."""
        at_a, at_b = self.versions[a], self.versions[b]
        out = []
        if s.mode == "STANDARD":
            if s.initial:
                return sorted(("INSERT", p, *img, v) for p, (img, v) in at_b.items())
            for p in at_a.keys() | at_b.keys():
                old, new = at_a.get(p), at_b.get(p)
                if old and not new:
                    out.append(("DELETE", p, *old[0], old[1]))
                elif new and not old:
                    out.append(("INSERT", p, *new[0], new[1]))
                elif old and new and old[0] != new[0]:
                    out.append(("UPDATE_BEFORE", p, *old[0], old[1]))
                    out.append(("UPDATE_AFTER", p, *new[0], new[1]))
            return sorted(out)
        if s.initial:
            out += [("INSERT", p, *img, v) for p, (img, v) in at_a.items()]
        for v in range(a + 1, b + 1):
            before, now = self.versions[v - 1], self.versions[v]
            out += [("INSERT", p, *now[p][0], v) for p in now.keys() - before.keys()]
        return sorted(out)


def rows(table) -> list[tuple]:
    d = table.to_pydict()
    return sorted(zip(d["__change_type"], d["relative_path"], d["size"], d["etag"],
                      d["__commit_version"], strict=True))


class SinkFailed(Exception):
    pass


class Histories(RuleBasedStateMachine):
    streams = Bundle("streams")

    @initialize(target=streams, modes=st.lists(st.tuples(
        st.sampled_from(["STANDARD", "APPEND_ONLY"]), st.booleans()), min_size=1, max_size=3),
        listener=st.sampled_from([False, False, True]))
    def setup(self, modes, listener):
        self.tmp = tempfile.mkdtemp(prefix="vs-history-")
        self.root = os.path.join(self.tmp, "data")
        os.mkdir(self.root)
        self.cat = vs.connect(os.path.join(self.tmp, "wh"))
        self.watcher = None
        event("kept current by " + ("the listener" if listener else "refresh"))
        if listener:  # files arrive complete (renamed into place) from a staging folder
            self.staging = os.path.join(self.tmp, "staging")
            os.mkdir(self.staging)
            self.cat.create_volume("v", self.root,
                                   notification=vs.LocalNotification(debounce_s=0.02))
            self.watcher = self.cat.watcher("v")
        else:
            self.cat.create_volume("v", self.root)
        #: the table's version at the end of each oracle version (a drain may commit several)
        self.real = [0]
        self.oracle = Oracle()
        self.models: dict[str, StreamModel] = {}
        self.counter = 0
        self.clock_ns = time.time_ns()
        return multiple(*(self.create_stream(mode, initial) for mode, initial in modes))

    def teardown(self):
        if getattr(self, "watcher", None) is not None:
            self.watcher.close()
        if getattr(self, "tmp", None):
            shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ the folder
    def _stamp(self, path: str, offset_s: int) -> None:
        """Set the mtime from a clock that moves 1 ms per change: every write is a new image,
        whatever the file system's timestamp granularity, so a replayed history behaves the
        same (hypothesis needs that). Same-tick rewrites are covered by the unit tests."""
        self.clock_ns += 1_000_000
        when = self.clock_ns + offset_s * 1_000_000_000
        os.utime(path, ns=(when, when))

    def _path(self, name: str) -> str:
        return os.path.join(self.root, *name.split("/"))

    def _listing(self) -> tuple[dict[str, Image], int]:
        """The folder as the documented rule sees it: (size, mtime_ns-size etag) per file."""
        listing, unsafe = {}, 0
        for name in NAMES:
            try:
                stat = os.stat(self._path(name))
            except FileNotFoundError:
                continue
            if name in UNSAFE:
                unsafe += 1
            else:
                listing[name] = (stat.st_size, f"{stat.st_mtime_ns:x}-{stat.st_size:x}")
        return listing, unsafe

    # each change of the folder may be followed by a refresh, so histories reach many
    # versions in few steps
    @rule(name=st.sampled_from(NAMES), size=st.integers(0, 40), then_refresh=st.booleans())
    def write(self, name, size, then_refresh):
        path = self._path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        staged = os.path.join(self.staging, "f") if self.watcher else path
        with open(staged, "wb") as f:
            f.write(os.urandom(size))
        self._stamp(staged, 0)
        if self.watcher:
            os.replace(staged, path)
        self._then(then_refresh)

    def _then(self, then_refresh: bool) -> None:
        if self.watcher:
            self.drain()  # each change drained: the oracle knows the folder between changes
        elif then_refresh:
            self.refresh()

    @rule(name=st.sampled_from(NAMES), then_refresh=st.booleans())
    def delete(self, name, then_refresh):
        try:
            os.remove(self._path(name))
        except FileNotFoundError:
            pass
        self._then(then_refresh)

    @rule(src=st.sampled_from(NAMES), dst=st.sampled_from(NAMES), then_refresh=st.booleans())
    def rename(self, src, dst, then_refresh):
        if src != dst and os.path.exists(self._path(src)):
            os.makedirs(os.path.dirname(self._path(dst)), exist_ok=True)
            os.replace(self._path(src), self._path(dst))
        self._then(then_refresh)

    @rule(name=st.sampled_from(SAFE), offset_s=st.sampled_from([-3600, 3600, 1]),
          then_refresh=st.booleans())
    def touch(self, name, offset_s, then_refresh):
        """A new mtime (an hour behind, ahead, or now): the documented rule calls it a change."""
        if os.path.exists(self._path(name)):
            self._stamp(self._path(name), offset_s)
        self._then(then_refresh)

    # ------------------------------------------------------------------ the volume
    def _images(self) -> dict[str, Image]:
        snap = self.cat.directory_table("v").snapshot(columns=["relative_path", "size", "etag"])
        return {p: (s, e) for p, s, e in zip(snap["relative_path"].to_pylist(),
                                             snap["size"].to_pylist(),
                                             snap["etag"].to_pylist(), strict=True)}

    def drain(self):
        """Run the watcher's steps until the listener is idle and the table holds the folder
        (waiting on that condition; a listener that misses a change fails the deadline)."""
        listing, _ = self._listing()
        deadline = time.monotonic() + 30
        while True:
            step = self.watcher.step(0.05)
            if step.idle and self._images() == listing:
                break
            assert time.monotonic() < deadline, ("the listener never caught up",
                                                 self._images(), listing)
        version = self.cat.directory_table("v").version()
        if self.oracle.commit(listing) is None:
            assert version == self.real[-1]  # nothing changed, nothing committed
        else:
            assert version > self.real[-1]
            self.real.append(version)

    def _logical(self, version: int) -> int:
        """The oracle version (drain) whose commits include the table's `version`."""
        return bisect.bisect_left(self.real, version)

    def rows(self, table) -> list[tuple]:
        return sorted((c, p, s, e, self._logical(v)) for c, p, s, e, v in rows(table))

    @rule()
    def refresh(self):
        if self.watcher:
            self.drain()
        listing, unsafe = self._listing()
        before = self.oracle.versions[-1]
        m = self.cat.refresh("v")
        expected = self.oracle.commit(listing)
        assert m.version == expected, (m, expected)
        if expected is not None:
            assert not self.watcher, "the listener and refresh disagree on what changed"
            self.real.append(m.version)
        assert m.invalid_paths == unsafe
        after = self.oracle.versions[-1]
        assert m.inserted == len(after.keys() - before.keys())
        assert m.deleted == len(before.keys() - after.keys())
        assert m.updated == sum(1 for p in after.keys() & before.keys()
                                if after[p][0] != before[p][0])

    @invariant()
    def table_is_the_latest_snapshot(self):
        if not hasattr(self, "cat"):
            return
        got = self._images()
        assert got == {p: img for p, (img, _) in self.oracle.versions[-1].items()}
        assert self.cat.directory_table("v").version() == self.real[-1]

    # ------------------------------------------------------------------ streams
    @rule(target=streams, mode=st.sampled_from(["STANDARD", "APPEND_ONLY"]),
          initial=st.booleans())
    def create_stream(self, mode, initial):
        self.counter += 1
        name = f"s{self.counter}"
        spec = self.cat.create_stream(name, "v", mode=mode, show_initial_rows=initial)
        assert spec["offset"] == self.real[-1]
        self.models[name] = StreamModel(mode, self.oracle.latest, initial)
        return name

    @rule(name=streams)
    def read(self, name):
        s = self.models[name]
        assert self.rows(self.cat.read_stream_arrow(name)) == self.oracle.records(
            s, s.offset, self.oracle.latest)

    @rule(name=streams, fail=st.booleans())
    def consume(self, name, fail):
        s = self.models[name]
        a = s.offset
        b = s.pinned if s.pinned is not None else self.oracle.latest
        moves = a != b or s.initial
        try:
            with self.cat.consume(name) as batch:
                assert (batch.start_version, batch.end_version, batch.batch_id) == \
                    (self.real[a], self.real[b], s.batch_id)
                assert self.rows(batch.records) == self.oracle.records(s, a, b)
                if fail:
                    raise SinkFailed(name)
        except SinkFailed:
            if moves:
                s.pinned = b  # the retry must see exactly (a, b]
        else:
            if moves:
                s.offset, s.batch_id, s.initial, s.pinned = b, s.batch_id + 1, False, None
        info = self.cat.describe_stream(name)
        assert (info["offset"], info["batch_id"]) == (self.real[s.offset], s.batch_id)

    @precondition(lambda self: any(m.pinned is not None for m in self.models.values()))
    @rule(data=st.data(), size=st.integers(0, 40), fail=st.booleans())
    def retry_after_new_files(self, data, size, fail):
        """A failed batch, a file arriving, the retry: it gets exactly the range pinned first."""
        name = data.draw(st.sampled_from(sorted(n for n, m in self.models.items()
                                                if m.pinned is not None)))
        self.write(data.draw(st.sampled_from(NAMES)), size, then_refresh=True)
        self.consume(name, fail)

    @precondition(lambda self: len(getattr(self, "models", {})) > 0)
    @rule(name=consumes(streams))
    def drop_stream(self, name):
        assert self.cat.drop_stream(name)
        del self.models[name]


Histories.TestCase.settings = settings()  # the profile loaded above
TestHistories = Histories.TestCase
