"""Per-file UDF pipelines (DESIGN §7). Import from the modules: this package imports nothing, so
an executor loading `pipelines.udf` or `pipelines.executor` loads no driver-side code.

    udf       FileRecord, FileUdf, @file_udf (driver and executors; no Spark at import)
    options   PipelineOptions, PipelineMetrics
    pipeline  Pipeline (driver): run_once, run_forever
    run       one batch: pin, plan, run on executors, commit, move the offset
    executor  what runs inside mapInArrow on the executors
    sink      the Delta target: exactly-once commits with app transactions
"""
