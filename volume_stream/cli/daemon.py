"""The `daemon` and `config check` commands of the `volume-stream` CLI.

    volume-stream daemon --config volume-stream.toml [--log-json]
    volume-stream config check volume-stream.toml [--json]

`daemon` runs until SIGTERM/SIGINT and exits 0 after a clean stop; a configuration error exits
2 with a message naming the key, the file and what is allowed; other start-up failures exit 1.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from volume_stream.cli._common import note_new_warehouse
from volume_stream.errors import ConfigError, VolumeStreamError, WarehouseError

if TYPE_CHECKING:
    from volume_stream.config.daemon import DaemonConfig

__all__ = ["register"]

config_app = typer.Typer(help="Check daemon configuration files.", no_args_is_help=True,
                         rich_markup_mode=None)  # plain click help, as cli/app.py

ConfigFile = Annotated[Path, typer.Option("--config", "-c", help="The daemon's TOML file.",
                                          show_default=False)]


def _check_pipeline_specs(cfg: DaemonConfig, path: Path) -> None:
    """Every enabled `[pipelines.NAME] spec` must be a readable, valid pipeline spec: a daemon
    whose pipeline job can only fail must not start (nor report ready)."""
    problems = []
    for name, pipe in cfg.pipelines.items():
        if pipe.enabled and pipe.spec is not None:
            try:
                from volume_stream.cli.jobs import load_spec  # not at import: start-up time

                load_spec(pipe.spec)
            except VolumeStreamError as exc:
                problems.append(f"{path}: key 'pipelines.{name}.spec': {exc}")
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


def _check_what_the_daemon_refuses(cfg: DaemonConfig, path: Path) -> None:
    """What the daemon would refuse at start, refused by `config check` too: a signed shard API
    without its key in the environment, a volume to create without a location, an object-store
    volume with no notification queue."""
    import os

    from volume_stream.catalog import connect  # not at import: start-up time
    from volume_stream.daemon.daemon import queue_missing  # not at import: start-up time

    problems = []
    api = cfg.shard_api
    if api.enabled and api.require_signature and not (
            os.environ.get("VOLUME_STREAM_SHARD_API_ACCESS_KEY_ID")
            and os.environ.get("VOLUME_STREAM_SHARD_API_SECRET")):
        problems.append(f"{path}: key 'shard_api.require_signature': needs the key in "
                        f"VOLUME_STREAM_SHARD_API_ACCESS_KEY_ID and VOLUME_STREAM_SHARD_API_SECRET"
                        f" (never in the file)")
    try:
        existing = {v["name"]: v for v in connect(
            cfg.warehouse, storage_options=cfg.storage_options, create=False).list_volumes()}
    except WarehouseError:  # no warehouse yet: every volume is to be created
        existing = {}
    except VolumeStreamError:  # the store cannot answer now: the daemon checks when it can
        existing = None
    for name, vol in cfg.volumes.items():
        if not vol.enabled or existing is None:
            continue
        stored = existing.get(name)
        if stored is None and vol.location is None:
            problems.append(f"{path}: key 'volumes.{name}.location': volume {name!r} is not in "
                            f"the warehouse {cfg.warehouse} and no location is given to create "
                            f"it")
        missing = queue_missing(vol, stored)
        if missing:
            problems.append(f"{path}: key 'volumes.{name}.notification': {missing}")
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


def _load(path: Path, *, check_warehouse: bool = True):
    """The configuration, checked; `config check` also checks it against the warehouse (the
    daemon does that itself as it starts, retrying while the store does not answer)."""
    try:
        from volume_stream.config.daemon import DaemonConfig  # not at import: other commands

        cfg = DaemonConfig.load(path)
        _check_pipeline_specs(cfg, path)
        if check_warehouse:
            _check_what_the_daemon_refuses(cfg, path)
        return cfg
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None


def daemon(
    config: ConfigFile,
    log_json: Annotated[bool, typer.Option("--log-json", help="Log one JSON object per line.")
                        ] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Let Spark's own log lines through.")] = False,
) -> None:
    """Run the listeners, refreshes and pipelines of a configuration until SIGTERM/SIGINT."""
    if verbose:
        os.environ["VOLUME_STREAM_VERBOSE"] = "1"
    cfg = _load(config, check_warehouse=False)
    from volume_stream.daemon.logs import configure_logging

    configure_logging(cfg.log_level, json_lines=log_json or cfg.log_json)
    log = logging.getLogger("volume_stream.daemon")
    from volume_stream.daemon.daemon import Daemon  # not at import: other commands start faster

    note_new_warehouse(cfg.warehouse)  # removed again if the daemon refuses to start
    running = None
    try:
        running = Daemon(cfg)
        code = running.run()
    except ConfigError as exc:
        log.error("configuration error in %s: %s", config, exc)
        raise typer.Exit(2) from None
    except (VolumeStreamError, OSError) as exc:
        started = running is not None and running.running
        log.error("daemon failed%s: %s", "" if started else " to start", exc, exc_info=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


@config_app.command("check")
def config_check(
    file: Annotated[Path, typer.Argument(help="The daemon's TOML file.", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the effective configuration "
                                                         "as JSON.")] = False,
) -> None:
    """Validate a daemon configuration (with VOLUME_STREAM_* overrides) and summarise it."""
    cfg = _load(file)
    if as_json:
        print(json.dumps(cfg.summary(), indent=2))
        return
    print(f"{file}: ok")
    print(f"  warehouse  {cfg.warehouse}")
    metrics = (f"http://{cfg.metrics.host}:{cfg.metrics.port}/metrics (/healthz, /readyz)"
               if cfg.metrics.enabled else "disabled")
    print(f"  metrics    {metrics}")
    for name, vol in cfg.volumes.items():
        note = (vol.notification or {}).get("type") or (
            "LOCAL (inotify)" if "://" not in str(vol.location or "file://")
            or str(vol.location).startswith("file://") else "none")
        state = "" if vol.enabled else " (disabled)"
        refresh = f"every {vol.refresh_interval_s:g}s" if vol.refresh_interval_s else "never"
        print(f"  volume     {name}{state}: {vol.location or '(existing)'}, notification {note}, "
              f"group commit ~{vol.target_commit_s:g}s / {vol.max_batch_bytes >> 20} MiB"
              f"{f' / {vol.max_batch_events} events' if vol.max_batch_events else ''}"
              f" / {vol.max_wait_s:g}s, refresh {refresh}")
        for stream, scfg in vol.streams.items():
            print(f"  stream     {stream} on {name} ({scfg.mode})")
    for name, pipe in cfg.pipelines.items():
        what = f"run {pipe.spec}" if pipe.spec else " ".join(pipe.command or [])
        where = ("in the daemon's Spark session" if pipe.spec and not pipe.isolate
                 else "as a child process")
        state = "" if pipe.enabled else " (disabled)"
        print(f"  pipeline   {name}{state}: {what}, every {pipe.interval_s:g}s, {where}")
    if cfg.spark.connect_port is not None:
        print(f"  spark      Spark Connect on sc://{cfg.spark.connect_host}:"
              f"{cfg.spark.connect_port} (volume-stream sql --remote ...)")


def register(app: typer.Typer) -> None:
    """Add `daemon` and `config check` to the `volume-stream` app."""
    app.command("daemon")(daemon)
    app.add_typer(config_app, name="config")
