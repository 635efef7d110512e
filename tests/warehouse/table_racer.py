"""A table writer for the race tests: `python -m tests.warehouse.table_racer URI NAME N`.

Against the warehouse at URI (tables `t (writer STRING, i INT)` and `c (k INT, n INT)` with the
row (1, 0) exist), N times: insert the row (NAME, i) into `t`, then `UPDATE c SET n = n + 1`
(a read-modify-write that a lost update would show), each its own delta-rs commit racing any
other writer for the next version; after each insert it prints one JSON line (flushed) with the
version it committed."""

from __future__ import annotations

import json
import sys

import pyarrow as pa

import volume_stream as vs


def main(uri: str, name: str, n: int) -> None:
    tables = vs.connect(uri).tables
    for i in range(n):
        version, _ = tables.insert("t", pa.table({"writer": [name], "i": [i]}))
        print(json.dumps({"writer": name, "i": i, "version": version}), flush=True)
        tables.update("c", {"n": "n + 1"}, where="k = 1")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
