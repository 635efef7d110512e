"""Pipeline jobs (kept at this path for `examples/run_job.py` and spark-submit users): the code
lives in `volume_stream.cli.jobs`.

    spark-submit examples/run_job.py SPEC      # from volume_stream.jobs import main
"""

from volume_stream.cli.jobs import (
    EXIT_FAILED,
    EXIT_FILE_ERRORS,
    EXIT_OK,
    JobResult,
    PipelineSpec,
    job_session,
    load_spec,
    load_udf,
    main,
    run_job,
)

__all__ = ["EXIT_FAILED", "EXIT_FILE_ERRORS", "EXIT_OK", "JobResult", "PipelineSpec",
           "job_session", "load_spec", "load_udf", "main", "run_job"]

if __name__ == "__main__":
    raise SystemExit(main())
