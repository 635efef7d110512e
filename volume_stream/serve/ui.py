"""The read-only status page: Starlette + Jinja2 over `StatusSource` (DESIGN §8.3).

Every HTML page has a JSON twin, as in Datasette:

    /                                /status.json          volumes, streams, pipelines, logs
    /volumes/NAME                    /volumes/NAME.json    one volume and its latest commits
    /streams/NAME                    /streams/NAME.json    one stream and its pending records
    /files?volume=V&path=P           /files.json?...       every change of one file

The HTML pages poll themselves with htmx (`hx-trigger="every 2s"`): a request carrying
`HX-Request` gets the page's inner part only, so the page updates without a reload. htmx is
served from the package (`static/htmx.min.js`, with its licence): nothing is fetched from
elsewhere, the page works offline.

The page binds to 127.0.0.1 unless told otherwise; a non-loopback address needs a token
(`check_listen`), and with a token every request without it (`Authorization: Bearer T` or
`?token=T`) is answered 401. `HttpServer` serves any ASGI app from a thread (the daemon serves
`/metrics`, `/healthz`, `/readyz` and this page on one port through it).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from volume_stream.errors import ConfigError, InvalidInputError, NotFoundError, VolumeStreamError
from volume_stream.serve.charts import DEFAULT_RANGE, RANGES, range_seconds
from volume_stream.serve.server import is_loopback
from volume_stream.serve.status import StatusSource

__all__ = ["HttpServer", "check_listen", "status_app", "status_routes", "TokenGate"]

log = logging.getLogger("volume_stream.ui")
_HERE = Path(__file__).parent
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(_HERE / "templates"),
                          autoescape=True)
POLL = "every 2s"


def check_listen(host: str, token: str | None) -> None:
    """Refuse to serve the page on an address other machines reach without a token."""
    if not token and not is_loopback(host):
        raise ConfigError(f"the status page would serve {host}, not a loopback address, to "
                          f"anyone who can reach it: give --token (or set "
                          f"VOLUME_STREAM_UI_TOKEN), or bind 127.0.0.1")


def _size(n: Any) -> str:
    if not isinstance(n, int | float):
        return "" if n is None else str(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _age(seconds: Any) -> str:
    if not isinstance(seconds, int | float):
        return ""
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h {s % 3600 // 60}m" if s < 172800 else f"{s // 86400}d"


#: stream rows on one page of `/` (the JSON twin has them all)
STREAMS_PER_PAGE = 100


def _streams_page(streams: list[dict[str, Any]], page: Any) -> dict[str, Any]:
    """The page `page` (from 1) of the stream rows; past one page, ordered by what needs a
    look: errors, stale streams, then the most pending changes."""
    try:
        page = max(int(page), 1)
    except (TypeError, ValueError):
        page = 1
    ordered = streams
    if len(streams) > STREAMS_PER_PAGE:
        ordered = sorted(streams, key=lambda s: (not s.get("error"), not s.get("stale"),
                                                 -(s.get("pending_changes") or 0), s["name"]))
    pages = max((len(streams) + STREAMS_PER_PAGE - 1) // STREAMS_PER_PAGE, 1)
    page = min(page, pages)
    start = (page - 1) * STREAMS_PER_PAGE
    return {"rows": ordered[start:start + STREAMS_PER_PAGE], "page": page, "pages": pages,
            "first": start + 1, "last": min(start + STREAMS_PER_PAGE, len(streams)),
            "total": len(streams)}


def _count(n: Any) -> str:
    """A count with thousands separators (12,345); anything else as it is."""
    if isinstance(n, bool) or not isinstance(n, int | float):
        return "" if n is None else str(n)
    if isinstance(n, float) and not n.is_integer():
        return f"{n:,.2f}"
    return f"{int(n):,}"


def _json_href(path: str) -> str:
    """A page's JSON twin: `/status.json` for `/`, else the path with `.json`."""
    return "/status.json" if path in ("", "/") else f"{path}.json"


_ENV.globals["streams_page"] = _streams_page
_ENV.globals["ranges"] = list(RANGES)
_ENV.globals["default_range"] = DEFAULT_RANGE
_ENV.filters["n"] = _count
_ENV.filters["json_href"] = _json_href
_ENV.filters["size"] = _size
_ENV.filters["age"] = _age
_ENV.filters["q"] = lambda v: quote(str(v), safe="")


class TokenGate:
    """ASGI middleware: with a token, refuse (401) every request to a path not in `open_paths`
    that does not carry it as `Authorization: Bearer T` or `?token=T`."""

    def __init__(self, app: Any, token: str | None, open_paths: Iterable[str] = ()) -> None:
        self.app, self.token, self.open_paths = app, token, frozenset(open_paths)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.token or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        given = request.query_params.get("token") or ""
        header = request.headers.get("authorization", "")
        if header[:7].lower() == "bearer ":
            given = header[7:].strip()
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            response = JSONResponse({"error": "a token is required: send 'Authorization: "
                                              "Bearer TOKEN' or add ?token=TOKEN"}, 401,
                                    headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def status_routes(source: StatusSource) -> list[BaseRoute]:
    """The page's routes (HTML and JSON) and its static files, over `source`."""

    def page(template: str, facts: Callable[[Request], dict[str, Any]], as_json: bool
             ) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            try:
                data = facts(request)
                status = 200
            except NotFoundError as exc:
                data, status = {"error": exc.message("cli")}, 404
            except InvalidInputError as exc:
                data, status = {"error": exc.message("cli")}, 400
            except VolumeStreamError as exc:
                data, status = {"error": exc.message("cli")}, 500
            except Exception as exc:  # a page that fails says why; the server keeps serving
                log.exception("status page %s failed", request.url.path)
                data, status = {"error": f"{type(exc).__name__}: {exc}"}, 500
            if as_json:
                return Response(json.dumps(data, ensure_ascii=False, default=str), status,
                                media_type="application/json")
            token = request.query_params.get("token")
            fragment = request.headers.get("hx-request") == "true"
            html = _ENV.get_template(template).render(
                d=data, fragment=fragment, poll=POLL, request_path=request.url.path,
                params=dict(request.query_params), tq=urlencode({"token": token}) if token else "",
                error=data.get("error") if status != 200 else None)
            return HTMLResponse(html, status)
        return endpoint

    def files(request: Request) -> dict[str, Any]:
        volume, path = request.query_params.get("volume"), request.query_params.get("path")
        if not volume or not path:
            raise InvalidInputError("give ?volume=NAME&path=relative/path")
        return source.file_history(volume, path)

    views: list[tuple[str, str, Callable[[Request], dict[str, Any]]]] = [
        ("/status", "index.html",
         lambda r: source.status(range_seconds(r.query_params.get("range")))),
        ("/volumes/{name}", "volume.html", lambda r: source.volume(r.path_params["name"])),
        ("/streams/{name}", "stream.html", lambda r: source.stream(r.path_params["name"])),
        ("/files", "file.html", files),
    ]
    routes: list[BaseRoute] = []
    for path, template, facts in views:
        routes.append(Route(path + ".json", page(template, facts, True)))
        routes.append(Route("/" if path == "/status" else path, page(template, facts, False)))
    routes.append(Mount("/static", _Static(directory=_HERE / "static"), name="static"))
    return routes


class _Static(StaticFiles):
    """The page's scripts and styles, cached by the browser for an hour: a page reloaded on
    a busy daemon asks for its HTML only."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "public, max-age=3600"
        return response


def _not_found(routes_help: str) -> Callable[..., Any]:
    async def handler(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": f"not found; try {routes_help}"}, 404)
    return handler


def status_app(source: StatusSource | None, *, token: str | None = None,
               routes: Iterable[BaseRoute] = (), open_paths: Iterable[str] = ()) -> Any:
    """The status page over `source` (None: no page) beside `routes`, behind a `TokenGate`.

    Example:
        >>> app = status_app(StatusSource(connect("./warehouse")))
        >>> HttpServer(app, "127.0.0.1", 8080).start()
    """
    everything = [*routes, *(status_routes(source) if source is not None else [])]
    paths = sorted({r.path for r in routes if isinstance(r, Route)}
                   | ({"/", "/status.json"} if source is not None else set()))
    app = Starlette(routes=everything,
                    exception_handlers={404: _not_found(", ".join(paths))})
    return TokenGate(app, token, open_paths)


class HttpServer:
    """Serve an ASGI app with uvicorn on a background thread.

    The socket is bound and listening when `start` returns (an `OSError` such as a taken port
    is raised there); requests arriving before uvicorn's loop runs wait in the backlog.
    `port=0` picks a free port (`.port` after `start`).
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *,
                 name: str = "volume-stream-http") -> None:
        self.app, self.host, self._port, self.name = app, host, port, name
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def start(self) -> HttpServer:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self._port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        sock.set_inheritable(False)
        self._socket, self._port = sock, sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=2,
                                timeout_keep_alive=5)
        self._server = server = uvicorn.Server(config)
        self._thread = threading.Thread(target=lambda: asyncio.run(server.serve([sock])),
                                        name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port; idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()  # uvicorn closed it already unless it never started

    def __enter__(self) -> HttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
