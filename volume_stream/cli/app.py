"""The `volume-stream` command line: volume and stream admin, reading streams, watching.

    volume-stream volume create landing ./data
    volume-stream volume refresh landing
    volume-stream stream create new_files --on landing
    volume-stream stream read new_files --json
    volume-stream watch landing --until-idle

Every command takes `--warehouse` (default ./warehouse, or $VOLUME_STREAM_WAREHOUSE).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Annotated, Any

import typer
from rich.markup import escape

from volume_stream._exit import exit_process
from volume_stream.cli import daemon as daemon_commands
from volume_stream.cli import export as export_commands
from volume_stream.cli import jars as jars_commands
from volume_stream.cli import run as run_commands
from volume_stream.cli import shard_api as shard_api_commands
from volume_stream.cli import sql as sql_commands
from volume_stream.cli import status as status_commands
from volume_stream.cli._common import (
    INTERRUPTED,
    AsJson,
    Interrupted,
    Warehouse,
    discard_new_warehouses,
    err,
    has_warehouse,
    key_values,
    out,
    print_rows,
    quiet_py4j_interrupts,
    stop_on_sigterm,
    usage_names,
)
from volume_stream.cli._common import catalog as _catalog
from volume_stream.cli._progress import refresh_progress
from volume_stream.errors import InvalidInputError, VolumeStreamError
from volume_stream.serve.status import StatusSource
from volume_stream.sql.result import counted
from volume_stream.volumes.notifications import (
    BY_SCHEME,
    LocalNotification,
    notification_for,
    notification_from_dict,
)
from volume_stream.warehouse import STREAM, VOLUME

# Plain click help (rich_markup_mode=None): at 80 columns rich's panels cut option names and
# print `<bool>` for flags; click's layout keeps every name whole.
app = typer.Typer(help="Event-driven file streams on Apache Spark.", no_args_is_help=True,
                  pretty_exceptions_enable=False, rich_markup_mode=None)
volume_app = typer.Typer(help="Create, list, refresh and drop volumes.", no_args_is_help=True,
                         rich_markup_mode=None)
stream_app = typer.Typer(help="Create, list, describe, read and drop streams.",
                         no_args_is_help=True, rich_markup_mode=None)
app.add_typer(volume_app, name="volume")
app.add_typer(stream_app, name="stream")

def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"volume-stream {version('volume-stream')}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")
        ] = False) -> None:
    """Event-driven file streams on Apache Spark."""


# ---------------------------------------------------------------------- volumes
@volume_app.command("create")
def volume_create(
    name: str,
    location: str,
    recursive: Annotated[bool, typer.Option(help="Include files in subfolders.")] = True,
    include: Annotated[list[str] | None, typer.Option(help="Glob of paths to keep.")] = None,
    exclude: Annotated[list[str] | None, typer.Option(help="Glob of paths to skip.")] = None,
    retention_days: Annotated[float, typer.Option(help="Keep versions this long.")] = 7,
    polling: Annotated[bool, typer.Option(help="Poll instead of inotify.")] = False,
    replace: Annotated[bool, typer.Option(help="Replace a volume of that name.")] = False,
    deletion_vectors: Annotated[bool | None, typer.Option(
        "--deletion-vectors/--no-deletion-vectors",
        help="Merge-on-read directory table (default where the warehouse is local or S3).",
        show_default=False)] = None,
    if_not_exists: Annotated[bool, typer.Option(
        "--if-not-exists", help="Leave a volume of that name as it is.")] = False,
    notification: Annotated[str | None, typer.Option(
        help="Where its events arrive: an SQS queue URL (s3://), a Pub/Sub subscription "
             "projects/P/subscriptions/S (gs://), a Storage Queue's name (abfss://, az://); "
             "or the notification's keys as in the daemon's TOML, e.g. "
             "queue_name=q,wait_seconds=5 (type=... for another kind; credentials come from "
             "the environment, never from here).", metavar="QUEUE|KEY=VALUE,...")] = None,
    option: Annotated[list[str] | None, typer.Option(
        help="A connector option KEY=VALUE (endpoint, project, account_name, blob_endpoint, "
             "...); repeatable.", metavar="KEY=VALUE")] = None,
    warehouse: Warehouse = None,
) -> None:
    """Register a folder or an object-store prefix as a volume (its directory table starts
    empty: run refresh)."""
    options: dict[str, Any] = {"data_retention_days": retention_days}
    if deletion_vectors is not None:
        options["deletion_vectors"] = deletion_vectors
    for item in option or ():
        options.update(key_values(item, "--option"))
    if include:
        options["include"] = include
    if exclude:
        options["exclude"] = exclude
    cat = _catalog(warehouse, create=True)
    existed = if_not_exists and (VOLUME, name) in cat.warehouse.read()
    spec = cat.create_volume(
        name, location, recursive=recursive, replace=replace, if_not_exists=if_not_exists,
        notification=_notification(location, notification, polling), **options)
    if existed:
        out.print(f"volume [bold]{spec.name}[/bold] exists (at {escape(spec.location)}); left "
                  f"as it is")
        return
    out.print(f"created volume [bold]{spec.name}[/bold] at {escape(spec.location)}")


#: `--notification` given as the notification's keys (`type=...,queue_name=...`), not a queue
_KEYS = re.compile(r"^\s*[A-Za-z_][A-Za-z0-9_]*\s*=")


def _notification(location: str, given: str | None, polling: bool) -> Any:
    """The notification `--notification` describes: a queue's address, whose kind the volume's
    scheme tells, or the daemon's TOML keys (`type` defaults to the scheme's)."""
    if given is None:
        return LocalNotification(polling=True) if polling else None
    scheme = location.split("://", 1)[0].lower() if "://" in location else "file"
    if not _KEYS.match(given):
        return notification_for(scheme, given)
    keys = key_values(given, "--notification")
    default = BY_SCHEME.get(scheme)
    keys["type"] = str(keys.get("type", default.type if default else "")).upper()
    try:
        return notification_from_dict(keys)
    except TypeError as exc:  # a missing or unknown argument of the notification class
        raise InvalidInputError(f"--notification type={keys['type']}: {exc}") from None


@volume_app.command("upgrade")
def volume_upgrade(name: str, warehouse: Warehouse = None) -> None:
    """Make a volume's directory table merge-on-read (Delta deletion vectors): its readers then
    need Delta reader version 3 (delta-spark >= 2.3)."""
    version = _catalog(warehouse).upgrade_volume(name)
    out.print(f"volume [bold]{name}[/bold] " + (
        "has deletion vectors already" if version is None
        else f"upgraded to deletion vectors at version {version}"))


@volume_app.command("list")
def volume_list(warehouse: Warehouse = None, as_json: AsJson = False) -> None:
    """List volumes with their latest version, file count and last commit time."""
    cat = _catalog(warehouse)
    rows = []
    for v in cat.list_volumes():
        last = cat.history(v["name"], 1)
        rows.append({**v, "last_commit": last[0]["timestamp"] if last else None})
    print_rows(rows, as_json, "volumes")


@volume_app.command("describe")
def volume_describe(name: str, warehouse: Warehouse = None, as_json: AsJson = False) -> None:
    """Location, files, bytes, versions, options and latest commits of one volume."""
    info = StatusSource(_catalog(warehouse)).volume(name, commits=5)
    if as_json:
        print_rows([info], True)
        return
    history = info.pop("history")
    print_rows([{"property": k, "value": v} for k, v in info.items()], False, name)
    print_rows([{k: h[k] for k in ("version", "timestamp", "operation")} for h in history],
               False, f"{name}: latest commits")


@volume_app.command("refresh")
def volume_refresh(
        name: str,
        inventory: Annotated[str | None, typer.Option(
            help="Read an S3 Inventory / OSS inventory report instead of listing: the URL of "
                 "its manifest.json, or of the destination prefix (its newest report).",
            metavar="URI")] = None,
        warehouse: Warehouse = None) -> None:
    """List the volume and commit what changed since the directory table's latest version.

    On a terminal a live line counts the files listed and changed; otherwise (a pipe, a file)
    only the result line is printed."""
    cat = _catalog(warehouse)
    if out.is_terminal:
        with refresh_progress(out) as progress:
            m = cat.refresh(name, progress, inventory=inventory)
    else:
        m = cat.refresh(name, inventory=inventory)
    version = "no new version" if m.version is None else f"version {m.version}"
    source = "" if m.inventory_created is None else \
        f" from the inventory of {m.inventory_created:%Y-%m-%d %H:%M:%S} UTC"
    skipped = f", {m.invalid_paths} skipped (unsafe or undecodable names)" \
        if m.invalid_paths else ""
    out.print(f"refreshed {name}{source}: listed {m.listed}, +{m.inserted} ~{m.updated} "
              f"-{m.deleted}{skipped} ({version}, {m.seconds:.2f}s)")


@volume_app.command("optimize")
def volume_optimize(
        name: str,
        migrate: Annotated[bool, typer.Option(
            help="Rewrite a table of the pre-bucket layout into buckets first.")] = True,
        warehouse: Warehouse = None) -> None:
    """Compact the volume's directory table, checkpoint it and clean its log (streams are not
    disturbed: a compaction has no change records)."""
    r = _catalog(warehouse).optimize(name, migrate=migrate)
    migrated = "" if r.migrated_version is None else f"migrated at version {r.migrated_version}, "
    out.print(f"optimized {name}: {migrated}{r.buckets_compacted} bucket(s) compacted "
              f"({r.files_removed} files -> {r.files_added}), checkpoint at version "
              f"{r.checkpoint_version}")


@volume_app.command("drop")
def volume_drop(name: str, if_exists: bool = False,
                cascade: Annotated[bool, typer.Option(help="Also drop its streams.")] = False,
                warehouse: Warehouse = None) -> None:
    """Drop a volume and its directory table (the files themselves are not touched)."""
    if if_exists and not has_warehouse(warehouse):  # nothing to drop, nothing to create
        dropped = False
    else:
        dropped = _catalog(warehouse).drop_volume(name, if_exists=if_exists, cascade=cascade)
    out.print(f"dropped volume {name}" if dropped else f"no volume {name}")


# ---------------------------------------------------------------------- streams
@stream_app.command("create")
def stream_create(
    name: str,
    on: Annotated[str, typer.Option("--on", help="The volume to stream.")],
    mode: Annotated[str, typer.Option(help="STANDARD or APPEND_ONLY.")] = "STANDARD",
    show_initial_rows: Annotated[bool, typer.Option(help="First read returns existing files.")
                                 ] = False,
    at_timestamp: Annotated[str | None, typer.Option(help="ISO time to start from.")] = None,
    replace: bool = False,
    if_not_exists: Annotated[bool, typer.Option(
        "--if-not-exists", help="Leave a stream of that name (and its offset) as it is.")
        ] = False,
    warehouse: Warehouse = None,
) -> None:
    """Create a stream on a volume; its offset starts at the latest version."""
    cat = _catalog(warehouse)
    existed = if_not_exists and (STREAM, name) in cat.warehouse.read()
    info = cat.create_stream(name, on, mode=mode, replace=replace, if_not_exists=if_not_exists,
                             show_initial_rows=show_initial_rows, at_timestamp=at_timestamp)
    if existed:
        out.print(f"stream [bold]{name}[/bold] exists (at offset {info['offset']}); left as "
                  f"it is")
        return
    out.print(f"created stream [bold]{name}[/bold] on {on} ({info['mode']}) at version "
              f"{info['offset']}")


@stream_app.command("list")
def stream_list(warehouse: Warehouse = None, as_json: AsJson = False) -> None:
    """List streams with their volume (or table), mode, offset, pending changes and whether
    they are stale (their offset older than the oldest kept version)."""
    rows = [{"name": s["name"], "volume": s["source"] if s["on"] == "volume" else None,
             "table": s["source"] if s["on"] == "table" else None,
             **{k: s.get(k) for k in ("mode", "offset", "batch_id", "latest_version",
                                      "pending_changes", "stale")}}
            for s in StatusSource(_catalog(warehouse)).streams()]
    print_rows(rows, as_json, "streams")


@stream_app.command("describe")
def stream_describe(name: str, warehouse: Warehouse = None, as_json: AsJson = False) -> None:
    """Offset, latest version, pending changes, stale or not."""
    info = _catalog(warehouse).describe_stream(name)
    if as_json:
        print_rows([info], True)
    else:
        print_rows([{"property": k, "value": v} for k, v in info.items()], False, name)


@stream_app.command("read")
def stream_read(name: str, limit: Annotated[int | None, typer.Option(help="At most N rows.")
                                            ] = None,
                warehouse: Warehouse = None, as_json: AsJson = False) -> None:
    """Print the stream's pending change records (the offset does not move)."""
    if limit is not None and limit < 0:
        raise InvalidInputError(f"--limit {limit}: give a number of rows >= 0")
    records = _catalog(warehouse).read_stream_arrow(name)
    total = records.num_rows
    if limit is not None and limit < total:
        records = records.slice(0, limit)
        title = f"{name}: {records.num_rows} of {counted(total, 'change records')}"
    else:
        title = f"{name}: {counted(total, 'change records')}"
    print_rows(records.to_pylist(), as_json, title)


@stream_app.command("drop")
def stream_drop(name: str, if_exists: bool = False, warehouse: Warehouse = None) -> None:
    """Drop a stream (its offset is forgotten)."""
    if if_exists and not has_warehouse(warehouse):  # nothing to drop, nothing to create
        dropped = False
    else:
        dropped = _catalog(warehouse).drop_stream(name, if_exists=if_exists)
    out.print(f"dropped stream {name}" if dropped else f"no stream {name}")


# ---------------------------------------------------------------------- watch
@app.command("watch")
def watch(
    volume: str,
    until_idle: Annotated[bool, typer.Option(help="Return once no events are pending.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
    refresh: Annotated[bool, typer.Option(
        help="First commit what changed while nothing listened (a refresh).")] = True,
    warehouse: Warehouse = None,
) -> None:
    """Run the volume's listener in the foreground (Ctrl-C or SIGTERM stops it cleanly)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cat = _catalog(warehouse, create=False)
    cat.describe_volume(volume)  # an unknown volume is an error before anything is watched
    err.print(f"watching {volume} (Ctrl-C to stop)")
    with stop_on_sigterm():
        metrics = cat.watch(volume, until_idle=until_idle, timeout=timeout, refresh=refresh)
    print(json.dumps(metrics.as_dict()), flush=True)  # JSON, never restyled


# Commands kept in their own modules: `run` (pipelines), `daemon`/`config`, `sql`.
run_commands.register(app)
daemon_commands.register(app)
sql_commands.register(app)
shard_api_commands.register(app)
export_commands.register(app)
status_commands.register(app)
jars_commands.register(app)
usage_names(app)


def main() -> None:
    """The `volume-stream` command; ends through `exit_process` (see `volume_stream._exit`)."""
    quiet_py4j_interrupts()
    try:
        app()
        code: int | str | None = 0
    except SystemExit as exc:
        code = exc.code
        if code == INTERRUPTED:  # typer's word for a KeyboardInterrupt (Ctrl-C)
            err.print("interrupted", highlight=False)
    except Interrupted as exc:  # Ctrl-C in a command that says what became of its offsets
        err.print(str(exc), highlight=False, markup=False, soft_wrap=True)
        code = INTERRUPTED
    except VolumeStreamError as exc:
        # one unwrapped line: paths and names stay whole for copy and paste
        err.print(f"[red]error:[/red] {escape(exc.message('cli'))}", soft_wrap=True,
                  highlight=False)
        code = 1
    except KeyboardInterrupt:  # Ctrl-C outside a command: one line, the shell's code for it
        err.print("interrupted", highlight=False)
        code = INTERRUPTED
    if code not in (0, None):
        discard_new_warehouses()  # a failed command leaves no empty warehouse behind
    exit_process(code)


if __name__ == "__main__":
    main()
