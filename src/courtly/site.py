"""A small multi-origin web site served on 127.0.0.1, for the demo and the end-to-end tests.

Each origin is one port; each page is a status, headers and body (or a function of the request
count). Every request is logged with its arrival and completion time, so politeness can be
checked on the wire.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Self

from aiohttp import web


@dataclass
class Page:
    """One resource: body, status and headers (delay: seconds before answering)."""

    body: bytes | str = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "text/html"})
    delay: float = 0.0


Handler = Callable[[int], Page]  # called with how many times this path was requested before


@dataclass
class Hit:
    """One request as the server saw it."""

    origin: str
    path: str
    arrived: float
    done: float
    headers: dict[str, str]


class BackgroundServer:
    """Servers on 127.0.0.1 run by an event loop in a daemon thread; `with` starts and stops them.

    Subclasses set `self.origins` (name → "http://127.0.0.1:PORT") in `_start`.
    """

    origins: dict[str, str]

    def _open_loop(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _start(self) -> None:
        raise NotImplementedError

    async def _stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def url(self, name: str, path: str = "/") -> str:
        """Absolute URL of a path on a named origin."""
        return self.origins[name] + path


class LocalSite(BackgroundServer):
    """Serves {origin name: {path: Page | Handler}} on 127.0.0.1, one port per origin."""

    def __init__(
        self, sites: Mapping[str, Mapping[str, Page | Handler]], first_port: int = 0,
        keepalive_timeout: float = 75.0, tls: ssl.SSLContext | None = None,
    ) -> None:
        self.sites = sites
        self.first_port = first_port
        self.keepalive_timeout = keepalive_timeout  # idle connections closed, without a word
        self.tls = tls  # HTTPS with this server context
        self.origins: dict[str, str] = {}  # name -> "http://127.0.0.1:PORT"
        self.hits: list[Hit] = []
        self._counts: dict[tuple[str, str], int] = {}
        self._runners: list[web.AppRunner] = []
        self._open_loop()

    def hits_for(self, name: str) -> list[Hit]:
        """Requests that reached one origin, in arrival order."""
        origin = self.origins[name]
        return sorted((h for h in self.hits if h.origin == origin), key=lambda h: h.arrived)

    async def _start(self) -> None:
        for i, (name, pages) in enumerate(self.sites.items()):
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handler(name, pages))
            runner = web.AppRunner(app, access_log=None,
                                   keepalive_timeout=self.keepalive_timeout)
            await runner.setup()
            port = self.first_port + i if self.first_port else 0
            site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=self.tls)
            await site.start()
            server = site._server
            assert server is not None
            real_port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
            scheme = "https" if self.tls else "http"
            self.origins[name] = f"{scheme}://127.0.0.1:{real_port}"
            self._runners.append(runner)

    async def _stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()

    def _handler(
        self, name: str, pages: Mapping[str, Page | Handler]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            arrived = time.monotonic()
            key = request.path_qs
            entry = pages.get(key, pages.get(request.path))
            count = self._counts.get((name, key), 0)
            self._counts[(name, key)] = count + 1
            page = (entry(count) if callable(entry) else entry) if entry is not None else None
            if page is None:
                page = Page(b"not found", 404, {"Content-Type": "text/plain"})
            if page.delay:
                await asyncio.sleep(page.delay)
            body = page.body.encode() if isinstance(page.body, str) else page.body
            response = web.Response(body=body, status=page.status, headers=page.headers)
            self.hits.append(
                Hit(self.origins[name], key, arrived, time.monotonic(), dict(request.headers))
            )
            return response

        return handle


def html(title: str, links: list[str], head: str = "", body: str = "") -> str:
    """A minimal HTML page with links."""
    anchors = "".join(f'<a href="{href}">{href}</a> ' for href in links)
    return (
        f"<!doctype html><html><head><title>{title}</title>{head}</head>"
        f"<body><h1>{title}</h1><p>{body}</p>{anchors}</body></html>"
    )
