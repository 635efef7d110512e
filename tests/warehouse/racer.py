"""A writer for the race tests: `python -m tests.warehouse.racer URI NAME N`.

Against the warehouse at URI (volume `v` and stream `shared` exist), N times: create stream
`s_NAME_i` (a catalog compare-and-swap), commit `NAME/i.txt` to `v`'s directory table, then try
to consume `shared` (an offset compare-and-swap; losing the race is fine). After each step
that committed it prints one JSON line (flushed), so a parent that SIGKILLs it knows what was
committed before it died.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

import volume_stream as vs
from connectors.events import FileEvent
from volume_stream.errors import ConsumeConflictError


def say(**kw) -> None:
    print(json.dumps(kw), flush=True)


def main(uri: str, name: str, n: int) -> None:
    cat = vs.connect(uri)
    table = cat.directory_table("v")
    for i in range(n):
        cat.create_stream(f"s_{name}_{i}", on_volume="v")
        say(step="stream", name=f"s_{name}_{i}")
        result = table.apply([FileEvent.created(f"{name}/{i}.txt", size=i + 1,
                                                last_modified_time=datetime.now(UTC))])
        say(step="apply", path=f"{name}/{i}.txt", version=result.version)
        records, spec, a, b = cat.streams.pending("shared")
        if a == b:
            continue
        try:
            cat.commit_offset("shared", spec["volume_id"], a, b, spec["batch_id"])
        except ConsumeConflictError:
            continue
        say(step="consume", start=a, end=b, paths=records["relative_path"].to_pylist())


if __name__ == "__main__":
    import traceback

    from volume_stream._exit import exit_process

    # end as `volume-stream` does (DESIGN §8): delta-rs's native teardown can abort a process
    # whose work is done (delta-io/delta-rs#2184); this test checks the work, not the teardown
    try:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    except BaseException:
        traceback.print_exc()
        exit_process(1)
    exit_process(0)
