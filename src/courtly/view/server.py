"""The view's web server (aiohttp): the page, its JSON API and /metrics; read-only.

Only GET is routed: no endpoint changes the crawl or the database. The page's own script draws
everything with textContent (never markup) and the Content-Security-Policy allows no script but
courtly's files, so text from the web cannot run in the browser.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from courtly.store import StoreError
from courtly.view.metrics import database_families, exposition, live_families
from courtly.view.origins import DEFAULT_LIMIT, OriginTable

if TYPE_CHECKING:
    from courtly.crawler import Crawler
    from courtly.stats import CrawlStats

#: the files of the page, served as they are (package data)
STATIC = {"view.js": "text/javascript", "chart.js": "text/javascript", "view.css": "text/css",
          "index.html": "text/html"}
#: seconds the server waits for answers under way when it stops (a client that reads none of them
#: would hold the crawl's exit for aiohttp's 60 s a connection)
SHUTDOWN_SECONDS = 1.0
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class ViewError(Exception):
    """The view cannot be served (the address is taken, say); one line for the user."""


class View(Protocol):
    """What the server asks of a view (courtly.view.live or courtly.view.database)."""

    source: str

    async def run(self) -> None: ...
    async def summary(self) -> dict[str, Any]: ...
    def series(self) -> dict[str, Any]: ...
    async def origins(self) -> OriginTable: ...
    def errors(self) -> list[dict[str, Any]]: ...
    async def workers(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


def static_file(name: str) -> bytes:
    """One of the page's files."""
    return (resources.files("courtly.view") / "static" / name).read_bytes()


@web.middleware
async def _headers(request: web.Request,
                   handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                   ) -> web.StreamResponse:
    try:
        response = await handler(request)
    except StoreError as exc:  # the database is gone or damaged: say so, keep serving
        response = web.json_response({"error": str(exc)}, status=503)
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cache-Control"] = "no-store"
    return response


def make_app(view: View, families: Callable[[], Awaitable[list[Any]]]) -> web.Application:
    """The application: GET routes only."""

    async def page(request: web.Request) -> web.Response:
        return web.Response(body=static_file("index.html"), content_type="text/html",
                            charset="utf-8")

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            raise web.HTTPNotFound()
        return web.Response(body=static_file(name), content_type=STATIC[name], charset="utf-8")

    async def no_icon(request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def summary(request: web.Request) -> web.Response:
        return web.json_response(await view.summary())

    async def series(request: web.Request) -> web.Response:
        return web.json_response(view.series())

    async def origins(request: web.Request) -> web.Response:
        query = request.query
        try:
            limit = int(query.get("limit", DEFAULT_LIMIT))
        except ValueError:
            raise web.HTTPBadRequest(text="limit: a number of rows") from None
        origins = await view.origins()
        return web.json_response(origins.page(query.get("sort", "origin"),
                                              query.get("order", "asc") == "desc", limit))

    async def errors(request: web.Request) -> web.Response:
        return web.json_response({"errors": view.errors()})

    async def workers(request: web.Request) -> web.Response:
        return web.json_response(await view.workers())

    async def metrics(request: web.Request) -> web.Response:
        body = exposition(await families())
        return web.Response(body=body, headers={
            "Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    app = web.Application(middlewares=[_headers])
    for path, handler in (("/", page), ("/static/{name}", static), ("/api/summary", summary),
                          ("/api/series", series), ("/api/origins", origins),
                          ("/api/errors", errors), ("/api/workers", workers),
                          ("/metrics", metrics), ("/favicon.ico", no_icon)):
        app.router.add_get(path, handler)
    return app


async def start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Serve the app on host:port; returns the runner and the page's URL."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False,
                           shutdown_timeout=SHUTDOWN_SECONDS)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        # errno's text (uvloop's own message repeats the address); a name that does not resolve
        # (socket.gaierror, a negative errno) has its text in strerror
        errno = exc.errno or 0
        why = os.strerror(errno) if errno > 0 else (exc.strerror or str(exc))
        raise ViewError(f"cannot serve on {host}:{port}: {why}") from None
    bound = runner.addresses[0]
    shown = f"[{bound[0]}]" if ":" in str(bound[0]) else str(bound[0])
    return runner, f"http://{shown}:{bound[1]}/"


def announce(url: str, what: str) -> None:
    """One line on standard error saying where the page is."""
    print(f"courtly: serving {what} at {url} (read-only)", file=sys.stderr, flush=True)


def parse_address(value: str) -> tuple[str, int]:
    """'[HOST:]PORT' (HOST defaults to 127.0.0.1; an IPv6 HOST in brackets)."""
    host, _, port = value.rpartition(":")
    return (host.strip("[]") or "127.0.0.1"), int(port)


async def serve_crawl(crawler: Crawler, address: str) -> CrawlStats:
    """Run the crawl with its view served on `address` on the crawl's own event loop."""
    from courtly.store.reader import open_reader
    from courtly.view.live import LiveView

    host, port = parse_address(address)
    reader = open_reader(crawler.config.db) if crawler.store.shared else None
    view = LiveView(crawler, reader)
    runner, url = await start(make_app(view, lambda: live_families(view)), host, port)
    sampler = asyncio.create_task(view.run())
    announce(url, "the crawl")
    try:
        stats = await crawler.run()
        await view.linger()
        return stats
    finally:
        sampler.cancel()
        await runner.cleanup()
        view.close()


def serve_database(db: str, host: str, port: int) -> None:
    """`courtly serve`: the view of a crawl database until SIGINT or SIGTERM."""
    asyncio.run(_serve_database(db, host, port))


async def _serve_database(db: str, host: str, port: int) -> None:
    from courtly.store.reader import open_reader
    from courtly.view.database import DbView

    loop = asyncio.get_running_loop()
    view = DbView(await loop.run_in_executor(None, open_reader, db))
    try:
        runner, url = await start(make_app(view, lambda: database_families(view)), host, port)
    except ViewError:
        view.close()
        raise
    follow = asyncio.create_task(view.run())
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    announce(url, db if "://" not in db else view.reader.where)
    try:
        await stop.wait()
    finally:
        follow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follow
        await runner.cleanup()
        view.close()
