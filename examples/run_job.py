"""spark-submit entry script for pipeline jobs (the same job as `volume-stream run SPEC`).

    spark-submit --master local[2] examples/run_job.py examples/pipelines/image_metadata.toml \
        --warehouse /tmp/vs-demo/warehouse [--refresh] [--until-empty] [--fail-on-file-errors]

On a cluster, ship the packages with `--py-files volume_stream.zip` (volume_stream, connectors,
directory_table) and put the warehouse and the target on storage every node can reach. Prints
one JSON line of metrics per batch; exits 0 on success, 1 on failure, 3 with
`--fail-on-file-errors` when files went to the errors table.
"""

from __future__ import annotations

import sys

from volume_stream.jobs import main

if __name__ == "__main__":
    sys.exit(main())
