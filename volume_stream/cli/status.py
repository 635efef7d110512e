"""`volume-stream status` and `volume-stream ui`: the warehouse at a glance (DESIGN §8.3).

    volume-stream status [--watch] [--json]       one terminal screen (rich), or JSON
    volume-stream ui [--listen 127.0.0.1:8080] [--token T]   the status page, no daemon needed

Both read `StatusSource.status()`, the function behind the daemon's page and `/status.json`.
"""

from __future__ import annotations

import errno
import json
import sys
import threading
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from volume_stream.cli._common import Warehouse, err, out, stop_on_sigterm
from volume_stream.cli._common import catalog as _catalog
from volume_stream.config.settings import Settings
from volume_stream.errors import InvalidInputError, SourceError
from volume_stream.serve.server import parse_listen
from volume_stream.serve.status import StatusSource
from volume_stream.serve.ui import HttpServer, check_listen, status_app

__all__ = ["register", "render"]


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return ""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n:.1f} TiB"


def _cell(value: Any) -> Text:
    return Text("" if value is None else str(value))


def render(facts: dict[str, Any]) -> Group:
    """The facts of `StatusSource.status()` as rich tables, one per kind."""
    s = facts["summary"]
    head = Text.assemble(
        ("volume-stream status", "bold"), f"  {facts['warehouse']}  ",
        ("daemon" if facts["daemon"] else "no daemon", "dim"), f"  {facts['generated_at']}\n",
        f"{s['volumes']} volumes, {s['files']} files, {_size(s['bytes'])}; {s['streams']} "
        f"streams, {s['pending_changes']} pending changes, ",
        (f"{s['stale_streams']} stale", "red" if s["stale_streams"] else ""), ", ",
        (f"{s['errors']} errors", "red" if s["errors"] else ""))
    volumes = Table(title="volumes", title_justify="left")
    for col in ("volume", "location", "files", "bytes", "version", "last commit", "listener"):
        volumes.add_column(col, justify="right" if col in ("files", "bytes", "version")
                           else "left", overflow="fold")
    for v in facts["volumes"]:
        listener = v["listener"]["state"] if v.get("listener") else "-"
        volumes.add_row(_cell(v["name"]), _cell(v["location"]), _cell(v["files"]),
                        _cell(_size(v.get("bytes"))), _cell(v["version"]),
                        _cell(v.get("last_commit")),
                        Text(v.get("error") or listener, style="red" if v.get("error") else ""))
    streams = Table(title="streams", title_justify="left")
    for col in ("stream", "on", "mode", "offset", "latest", "pending", "stale", "waiting s"):
        streams.add_column(col, justify="right" if col in ("offset", "latest", "pending",
                                                          "waiting s") else "left")
    for st in facts["streams"]:
        stale = st.get("error") or ("yes" if st.get("stale") else "no")
        streams.add_row(_cell(st["name"]), _cell(f"{st['on']} {st['source']}"),
                        _cell(st["mode"]), _cell(st["offset"]), _cell(st.get("latest_version")),
                        _cell(st.get("pending_changes")),
                        Text(stale, style="red" if stale != "no" else ""),
                        _cell(st.get("staleness_s")))
    parts: list[Any] = [head, volumes, streams]
    if facts["pipelines"]:
        pipelines = Table(title="pipelines", title_justify="left")
        for col in ("pipeline", "running", "runs", "last outcome"):
            pipelines.add_column(col)
        for p in facts["pipelines"]:
            pipelines.add_row(_cell(p["name"]), _cell(p.get("running")), _cell(p.get("runs")),
                              Text(str(p.get("last_outcome") or ""),
                                   style="red" if p.get("error") else ""))
        parts.append(pipelines)
    if facts["change_logs"]:
        logs = Table(title="change logs", title_justify="left")
        for col in ("of", "label", "view", "enabled", "open shards"):
            logs.add_column(col)
        for c in facts["change_logs"]:
            logs.add_row(*(_cell(c[k]) for k in ("volume", "label", "view_type", "enabled",
                                                 "open_shards")))
        parts.append(logs)
    return Group(*parts)


def register(app: typer.Typer) -> None:
    """Add `status` and `ui` to the command."""

    @app.command("status")
    def status(
        watch: Annotated[bool, typer.Option(help="Redraw every --interval seconds.")] = False,
        interval: Annotated[float, typer.Option(help="Seconds between redraws (--watch).")
                            ] = 2.0,
        warehouse: Warehouse = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the facts as JSON.")
                           ] = False,
    ) -> None:
        """Volumes, streams (pending, stale), pipelines and change logs on one screen: what
        the status page shows (`ui`, or the daemon's `/`)."""
        if interval <= 0:
            raise InvalidInputError(f"--interval {interval}: give a number of seconds > 0")
        source = StatusSource(_catalog(warehouse))
        if as_json and not watch:
            print(json.dumps(source.status(), ensure_ascii=False))
            return
        if as_json:  # one JSON document a line, every interval
            stop = threading.Event()
            with stop_on_sigterm():
                while True:
                    print(json.dumps(source.status(), ensure_ascii=False), flush=True)
                    if stop.wait(interval):
                        return
        if not watch:
            out.print(render(source.status()))
            return
        stop = threading.Event()
        with stop_on_sigterm(), Live(render(source.status()), console=out,
                                     auto_refresh=False, screen=out.is_terminal) as live:
            while not stop.wait(interval):
                live.update(render(source.status()), refresh=True)

    @app.command("ui")
    def ui(
        listen: Annotated[str, typer.Option(help="HOST:PORT to serve the page on.")
                          ] = "127.0.0.1:8080",
        token: Annotated[str | None, typer.Option(
            help="Require this token (Authorization: Bearer T, or ?token=T); needed on a "
                 "non-loopback address. Default $VOLUME_STREAM_UI_TOKEN.")] = None,
        warehouse: Warehouse = None,
    ) -> None:
        """Serve the read-only status page of a warehouse (no daemon needed; a daemon serves
        the same page at its metrics port)."""
        host, port = parse_listen(listen)
        if token is None:
            secret = Settings().ui_token
            token = secret.get_secret_value() if secret else None
        check_listen(host, token)
        source = StatusSource(_catalog(warehouse))
        try:
            server = HttpServer(status_app(source, token=token), host, port,
                                name="volume-stream-ui").start()
        except OSError as exc:  # as the daemon: a port it cannot have is a configuration error
            why = {errno.EADDRINUSE: "it is already in use (another `ui`, or a daemon's page?);"
                                     " stop that process or give another --listen",
                   errno.EACCES: "this user may not bind it; give another --listen",
                   errno.EADDRNOTAVAIL: "it is not an address of this machine; give another "
                                        "--listen"}.get(exc.errno)
            if why is None:
                raise SourceError(f"cannot serve on {listen}: {exc.strerror or exc}") from exc
            print(f"error: cannot serve on {listen}: {why}", file=sys.stderr)
            raise typer.Exit(2) from None
        err.print(f"status page on {server.url}/ (JSON: {server.url}/status.json); "
                  f"Ctrl-C to stop", highlight=False, soft_wrap=True)
        print(f"{server.url}/", flush=True)  # the URL alone on stdout, for scripts
        stop = threading.Event()
        try:
            with stop_on_sigterm():
                while not stop.wait(3600):
                    pass
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
