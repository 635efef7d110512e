"""sqs: drain 20k pending S3 event messages into committed versions (target >= 0.5x raw).

moto's server runs in its own process on loopback (SQS is remote: its CPU is not ours). For each
run a fresh queue gets 20k realistic S3 event notification bodies (mostly new objects, some
overwrites and deletes of earlier keys, each event with a per-key growing sequencer), and is
drained by one of:

- ours: `Catalog.watch(volume, until_idle=True)` on an `s3://` volume fed by the queue: long
  poll, parallel receivers while the backlog lasts, parse, `DirectoryTable.apply` (one Delta
  commit per batch of up to 1000 messages), `DeleteMessageBatch` after each commit; the run
  checks that every message was taken and deleted and that the table equals the events' end
  state;
- baseline: the raw receive + delete rate of the same moto server and queue size with no
  processing at all: as many threads as the listener's `max_workers` (4), each looping
  `ReceiveMessage(10)` -> `DeleteMessageBatch`.

The runs alternate (raw, ours, raw, ours...) so load from other processes hits both alike; the
medians are shown. The figure is messages/s; ours/raw must be >= 0.5. Each run also prints how
ours split its time between receive (+ parse), apply and ack; with `--profile`, a cProfile of
the watch is printed when the target is missed.

moto as shipped is O(backlog) per SQS call (see `_index_moto_sqs`): 20k pending messages would
take hours to send and drain. The benchmark's moto process indexes its SQS model, keeping the
semantics, and fills queues in-process (SendMessageBatch over HTTP would take longer than the
drains it prepares).

    python -m benchmarks.bench_sqs [--quick] [--profile] [--messages N] [--repeats R]  # alone
    python -m benchmarks --only sqs                                                     # all
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

from benchmarks._context import Context
from benchmarks._report import Figure, Report, count_label, median, profile_top, timed

NAME = "sqs"
TITLE = "drain pending S3 events from SQS into committed versions vs raw receive+delete"
TARGET_RATIO = 0.5
WORKERS = 4  # SqsListener's default max_workers; the baseline uses as many threads
PREFIX = "bench/"
REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
CREDS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench-secret"}


@dataclass(frozen=True)
class Sizes:
    messages: int
    repeats: int


FULL = Sizes(messages=20_000, repeats=3)
QUICK = Sizes(messages=2_000, repeats=1)


# ---------------------------------------------------------------------- moto in a process
class _Visible:
    """`Queue.messages` made lazy: receive stops scanning once it has its 10 messages."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def __iter__(self) -> Any:
        now = time.time() * 1000.0  # Message.visible / .delayed, with one clock read
        return (m for m in self.queue._messages
                if now > m.visible_at and not now < m.delayed_until and "_gone" not in m.__dict__)

    def __bool__(self) -> bool:
        return next(iter(self), None) is not None

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _index_moto_sqs() -> Any:
    """Make moto's SQS model cost O(batch), not O(backlog), per call, keeping its semantics.

    As shipped, moto recomputes every queue attribute (three scans of all messages, with a
    datetime subtraction per message) for each message it sends or receives, and rebuilds the
    message list for each deleted handle: with 20k messages pending a drain takes hours. Here:
    the clock is `time.time()`, receive scans lazily, the retention check reads one attribute,
    deletes find the message through a handle index and compact the list now and then, and the
    model is guarded by one lock (moto's threaded server otherwise hands one message to two
    parallel receivers). Both drains of the benchmark run against this same server.
    """
    import inspect
    import threading

    import moto.sqs.models as m
    from moto.sqs.exceptions import ReceiptHandleIsInvalid

    now_ut, now_ms = m.unix_time, m.unix_time_millis
    m.unix_time = lambda dt=None: time.time() if dt is None else now_ut(dt)
    m.unix_time_millis = lambda dt=None: time.time() * 1000.0 if dt is None else now_ms(dt)
    m.Queue.messages = property(_Visible)
    m.Queue.approximate_number_of_messages_not_visible = property(lambda q: sum(
        1 for x in q._messages if "_gone" not in x.__dict__ and not x.visible))
    m.Queue.approximate_number_of_messages_delayed = property(lambda q: sum(
        1 for x in q._messages if "_gone" not in x.__dict__ and x.delayed))
    m.SQSBackend.is_message_valid_based_on_retention_period = lambda self, name, message: (
        int(self.get_queue(name).message_retention_period) + message.sent_timestamp / 1000
        > time.time())

    handles: dict[str, Any] = {}
    received = m.Message.mark_received

    def mark_received(self: Any, visibility_timeout: int | None = None) -> None:
        received(self, visibility_timeout)
        handles[self.receipt_handle] = self

    def delete_message(self: Any, receipt_handle: str) -> None:
        if receipt_handle in self.deleted_messages:
            return
        message = handles.get(receipt_handle)
        if message is None or "_gone" in message.__dict__:
            raise ReceiptHandleIsInvalid()
        message._gone = True
        self.pending_messages.discard(message)
        self.deleted_messages.update(message.all_receipt_handles)
        for handle in message.all_receipt_handles:
            handles.pop(handle, None)
        self._vs_gone = getattr(self, "_vs_gone", 0) + 1
        if self._vs_gone >= 256:
            self._messages = [x for x in self._messages if "_gone" not in x.__dict__]
            self._vs_gone = 0

    m.Message.mark_received = mark_received
    m.Queue.delete_message = delete_message

    lock = threading.RLock()

    def locked(fn: Any, unless_waiting: bool = False) -> Any:
        signature = inspect.signature(fn)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if unless_waiting and signature.bind(*args, **kwargs).arguments.get(
                    "wait_seconds_timeout"):
                return fn(*args, **kwargs)  # a long poll must not hold the lock
            with lock:
                return fn(*args, **kwargs)
        return wrapper

    for name in ("send_message", "send_message_batch", "delete_message",
                 "delete_message_batch", "change_message_visibility",
                 "change_message_visibility_batch", "purge_queue", "get_queue_attributes"):
        setattr(m.SQSBackend, name, locked(getattr(m.SQSBackend, name)))
    m.SQSBackend.receive_message = locked(m.SQSBackend.receive_message, unless_waiting=True)
    return lock


def serve_moto(port: int) -> None:
    """The benchmark's moto process: moto's server with `_index_moto_sqs`, and one stdin
    command, `fill QUEUE_NAME BODIES.json`, that enqueues the bodies in-process (SendMessage
    over HTTP would make filling 20k messages take longer than draining them)."""
    import moto.sqs.models as m
    from moto.server import ThreadedMotoServer

    lock = _index_moto_sqs()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    print("ready", flush=True)
    try:
        for line in sys.stdin:
            _, name, path = line.split()
            backend = m.sqs_backends[ACCOUNT][REGION]
            bodies = json.loads(Path(path).read_text())
            queue = backend.get_queue(name)
            with lock:
                for body in bodies:
                    message = m.Message(str(uuid.uuid4()), body)
                    message.mark_sent()
                    queue.add_message(message)
            print("filled", len(bodies), flush=True)
    finally:
        server.stop()


class MotoProcess:
    """Runs `serve_moto` in a child process (its CPU is not the benchmark's) and fills queues."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_sqs", "--serve-moto", str(port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=Path(__file__).resolve().parents[1])
        if self.proc.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError("the benchmark's moto server did not start")
        self._fills = 0

    def fill(self, queue_url: str, bodies: list[str]) -> float:
        """Enqueue `bodies` on the queue; returns the seconds taken."""
        self._fills += 1
        path = self.workdir / f"bodies-{self._fills}.json"
        path.write_text(json.dumps(bodies))
        started = time.perf_counter()
        self.proc.stdin.write(f"fill {queue_url.rsplit('/', 1)[1]} {path}\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().split()
        if answer != ["filled", str(len(bodies))]:
            raise RuntimeError(f"filling {queue_url} failed: {answer}")
        return time.perf_counter() - started

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


def clients(endpoint: str) -> tuple[Any, Any]:
    import boto3
    from botocore.config import Config

    kw = {"endpoint_url": endpoint, "region_name": REGION,
          "config": Config(max_pool_connections=16), **CREDS}
    return boto3.client("s3", **kw), boto3.client("sqs", **kw)


# ---------------------------------------------------------------------- realistic bodies
def event_bodies(bucket: str, n: int, *, t0: datetime) -> tuple[list[str], dict[str, int]]:
    """`n` S3 event notification bodies as S3 sends them to SQS, and the final state they
    describe ({relative path: size}).

    Every 10th message overwrites the key created 100 messages earlier, every 25th deletes the
    key created 200 earlier; the rest create new keys spread over date/hour folders. Each
    event of a key gets a larger sequencer than the previous one.
    """
    bodies, final = [], {}
    created = 0
    for i in range(n):
        when = t0 + timedelta(milliseconds=i)
        if i % 25 == 24 and created > 200:
            name, k = "ObjectRemoved:Delete", created - 200
        elif i % 10 == 9 and created > 100:
            name, k = "ObjectCreated:Put", created - 100
        else:
            name, k = "ObjectCreated:Put", created
            created += 1
        rel = f"dt=2025-01-{1 + k % 28:02d}/hour={k % 24:02d}/part-{k:07d} v1.json"
        size = 1000 + (i * 37) % 90_000
        obj: dict[str, Any] = {"key": quote_plus(PREFIX + rel),
                               "sequencer": f"{0x62E99A88DC4 + i:018X}"}
        if name.startswith("ObjectCreated"):
            obj.update(size=size, eTag=f"{uuid.UUID(int=i).hex}", versionId="null")
            final[rel] = size
        else:
            final.pop(rel, None)
        bodies.append(json.dumps({"Records": [{
            "eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": REGION,
            "eventTime": when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z",
            "eventName": name,
            "userIdentity": {"principalId": "AWS:AIDAJDPLRKLG7UEXAMPLE"},
            "requestParameters": {"sourceIPAddress": "10.0.12.34"},
            "responseElements": {"x-amz-request-id": f"C3D13FE58DE4{i:06X}",
                                 "x-amz-id-2": "FMyUVURIY8/IgAtTv8xRjskZQpcIZ9KG4V5Wp6S7S/JRWe"
                                               "UWerMUE5JgHvANOjpD"},
            "s3": {"s3SchemaVersion": "1.0", "configurationId": "volume-stream",
                   "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}",
                              "ownerIdentity": {"principalId": "A3NL1KOZZKExample"}},
                   "object": obj},
        }]}))
    return bodies, final


def new_queue(sqs: Any, name: str) -> str:
    # a visibility timeout no apply gets near, so no message comes back while in flight
    return sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "300"})["QueueUrl"]


def pending(sqs: Any, queue_url: str) -> tuple[int, int]:
    attrs = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return (int(attrs["ApproximateNumberOfMessages"]),
            int(attrs["ApproximateNumberOfMessagesNotVisible"]))


# ---------------------------------------------------------------------- the two drains
def raw_drain(sqs: Any, queue_url: str, workers: int = WORKERS) -> int:
    """Receive (10 a call) and delete with `workers` threads until the queue is empty;
    returns how many distinct messages were received."""
    seen: list[set[str]] = [set() for _ in range(workers)]

    def loop(slot: int) -> None:
        while True:
            got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10,
                                      WaitTimeSeconds=0).get("Messages", [])
            if not got:
                return
            sqs.delete_message_batch(QueueUrl=queue_url, Entries=[
                {"Id": str(j), "ReceiptHandle": m["ReceiptHandle"]} for j, m in enumerate(got)])
            seen[slot].update(m["MessageId"] for m in got)

    threads = [threading.Thread(target=loop, args=(s,), name=f"bench-raw-{s}")
               for s in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(set().union(*seen))


class StageClock:
    """Wraps a watcher's listener and table to time receive, apply and ack separately."""

    def __init__(self, watcher: Any) -> None:
        self.seconds = {"receive": 0.0, "apply": 0.0, "ack": 0.0}
        self.calls = {"receive": 0, "apply": 0, "ack": 0}
        listener, table = watcher.listener, watcher.table
        for stage, owner, attr in (("receive", listener, "receive"), ("ack", listener, "ack"),
                                   ("apply", table, "apply")):
            setattr(owner, attr, self._timed(stage, getattr(owner, attr)))

    def _timed(self, stage: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - started
                self.calls[stage] += 1
        return wrapper


def our_drain(cat: Any, volume: str, profile: bool = False) -> tuple[Any, StageClock, str]:
    """`Catalog.watch(until_idle=True)`'s loop, with each stage timed (and optionally
    profiled); returns (metrics, stage clock, profile text)."""
    watcher = cat.watcher(volume)
    clock = StageClock(watcher)
    text = ""
    with watcher.listener:
        if profile:
            holder: list[Any] = []
            text = profile_top(lambda: holder.append(watcher.run(until_idle=True, timeout=900)),
                               limit=25)
            metrics = holder[0]
        else:
            metrics = watcher.run(until_idle=True, timeout=900)
    return metrics, clock, text


# ---------------------------------------------------------------------- the benchmark
class Drains:
    """Runs the two drains on fresh, identically filled queues and checks what they did."""

    def __init__(self, ctx: Context, moto: MotoProcess, n: int) -> None:
        import volume_stream as vs

        self.vs, self.moto, self.n = vs, moto, n
        self.s3, self.sqs = clients(moto.endpoint)
        self.bucket = f"bench-{uuid.uuid4().hex[:8]}"
        self.s3.create_bucket(Bucket=self.bucket)
        self.bodies, self.final = event_bodies(self.bucket, n,
                                               t0=datetime.now(UTC) - timedelta(hours=1))
        self.cat = vs.connect(ctx.path("sqs-warehouse"))
        self._queues = 0

    def _queue(self, kind: str) -> str:
        self._queues += 1
        url = new_queue(self.sqs, f"{self.bucket}-{kind}-{self._queues}")
        self.moto.fill(url, self.bodies)
        if pending(self.sqs, url) != (self.n, 0):
            raise RuntimeError(f"{url} holds {pending(self.sqs, url)}, not {self.n} messages")
        return url

    def raw(self) -> float:
        url = self._queue("raw")
        seconds, drained = timed(lambda: raw_drain(self.sqs, url))
        left = pending(self.sqs, url)
        self.sqs.delete_queue(QueueUrl=url)
        if drained != self.n or left != (0, 0):
            raise RuntimeError(f"raw drain took {drained} of {self.n} messages; left {left}")
        return seconds

    def ours(self, profile: bool = False) -> tuple[float, Any, StageClock, str]:
        url = self._queue("ours")
        name = f"bench_{self._queues}"
        self.cat.create_volume(name, f"s3://{self.bucket}/{PREFIX}",
                               endpoint_url=self.moto.endpoint, region_name=REGION, **CREDS,
                               notification=self.vs.SqsNotification(url))
        seconds, (metrics, clock, text) = timed(lambda: our_drain(self.cat, name, profile))
        snap = self.cat.directory_table(name).snapshot(
            columns=["relative_path", "size"]).to_pydict()
        state = dict(zip(snap["relative_path"], snap["size"], strict=True))
        left = pending(self.sqs, url)
        self.sqs.delete_queue(QueueUrl=url)
        self.cat.drop_volume(name)
        if metrics.received != self.n or left != (0, 0) or state != self.final:
            raise RuntimeError(f"watch received {metrics.received} of {self.n}; queue left "
                               f"{left}; table matches the events: {state == self.final}")
        return seconds, metrics, clock, text


def run(ctx: Context, messages: int | None = None, repeats: int | None = None) -> None:
    sizes = QUICK if ctx.quick else FULL
    n, repeats = messages or sizes.messages, repeats or sizes.repeats
    report = ctx.report
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    moto = MotoProcess(ctx.workdir)
    try:
        drains = Drains(ctx, moto, n)
        report.note("messages", n, f"{n:,} S3 event bodies (ending in {len(drains.final):,} "
                                   f"objects: new keys, overwrites, deletes); moto's server in "
                                   f"its own process, SQS model indexed (see _index_moto_sqs); "
                                   f"{repeats} run(s) each, interleaved, median")
        raw_runs, our_runs, details = [], [], []
        for _ in range(repeats):  # interleaved, so load changes hit both alike
            raw_runs.append(drains.raw())
            seconds, metrics, clock, _ = drains.ours()
            our_runs.append(seconds)
            details.append({"seconds": round(seconds, 3), "versions": len(metrics.versions),
                            "stage_seconds": {k: round(v, 3) for k, v in clock.seconds.items()},
                            "stage_calls": dict(clock.calls)})
            report.say(f"run {len(our_runs)}: raw {raw_runs[-1]:.1f} s; ours {seconds:.1f} s = "
                       f"receive+parse {clock.seconds['receive']:.1f} s, apply "
                       f"{clock.seconds['apply']:.1f} s ({len(metrics.versions)} versions), ack "
                       f"{clock.seconds['ack']:.1f} s")
        raw_s, ours_s = median(raw_runs), median(our_runs)
        paired = [r / o for r, o in zip(raw_runs, our_runs, strict=True)]
        if repeats > 1:
            report.say("ours/raw per run (paired): " + ", ".join(f"{p:.2f}x" for p in paired))
        figure = report.add(Figure(
            name="sqs.drain",
            description=f"{count_label(n)} pending S3 event messages -> committed versions "
                        f"(Catalog.watch until idle: receive, apply, ack)",
            value=n / ours_s, unit="messages/s", baseline=n / raw_s,
            baseline_label=f"raw receive+delete ({WORKERS} threads)",
            target=f">= {TARGET_RATIO}x raw", passed=raw_s / ours_s >= TARGET_RATIO,
            details={"messages": n, "ours_seconds": our_runs, "raw_seconds": raw_runs,
                     "paired_ratios": paired,
                     "ours_runs": details, "rows": len(drains.final)}))
        if ctx.profile and not figure.passed:
            *_, text = drains.ours(profile=True)
            report.say("profile of the watch (main thread), top entries by cumulative time:")
            for line in text.splitlines():
                report.say("    " + line)
    finally:
        moto.close()


def main(argv: list[str] | None = None) -> int:
    """Run this benchmark alone: `python -m benchmarks.bench_sqs [--quick] [--profile]`."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_sqs",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK.messages:,} messages, not {FULL.messages:,}")
    parser.add_argument("--profile", action="store_true",
                        help="print a cProfile of the watch when the target is missed")
    parser.add_argument("--messages", type=int, help="how many messages (overrides the size)")
    parser.add_argument("--repeats", type=int, help="runs of each drain (median shown)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folders")
    parser.add_argument("--serve-moto", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_moto:
        serve_moto(args.serve_moto)
        return 0
    logging.basicConfig(level=logging.WARNING)
    report = Report(echo=lambda line: print(line, flush=True))
    ctx = Context(report, quick=args.quick, profile=args.profile, keep=args.keep)
    section = report.begin(NAME, TITLE)
    started = time.perf_counter()
    try:
        run(ctx, args.messages, args.repeats)
    finally:
        section.seconds = time.perf_counter() - started
        ctx.close()
    for line in report.summary_lines():
        print(line)
    print(f"total {section.seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
