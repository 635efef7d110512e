"""The long-running daemon (DESIGN §6, §9): `Daemon` runs every configured volume's
receive → commit → ack loop, scheduled refreshes, pipelines, metrics and probes.

    daemon           Daemon: start, stop, signals, readiness
    volume_runner    VolumeRunner: one volume's loop (group commit, backoff, refresh, optimize)
    poison           PoisonIsolator: bisect a failing batch, dead-letter its poison events
    pipeline_runner  PipelineRunner: a pipeline job as a child process on an interval
    metrics          DaemonMetrics (Prometheus), MetricsServer (/metrics, /healthz, /readyz)
    logs             configure_logging (text or JSON lines, secrets redacted)
"""

from volume_stream.daemon.daemon import Daemon

__all__ = ["Daemon"]
