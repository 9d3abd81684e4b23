"""A hostile web server for the tests: raw asyncio sockets on 127.0.0.1, one fault per origin.

Each origin is one listening port. `/robots.txt` answers 404 (allow all) unless the origin maps
that path itself; every other path is handled by the origin's fault, a coroutine that writes raw
bytes (or nothing) on the socket. Every request is logged with the time it arrived, the time its
connection ended and how many bytes the server managed to send, so a test can check how often and
how long each fault was hit.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import struct
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from courtly.site import BackgroundServer


@dataclass
class Request:
    """One request as the server read it."""

    method: str
    path: str
    headers: dict[str, str]


@dataclass
class HostileHit:
    """One request and what became of its connection."""

    origin: str
    path: str
    arrived: float
    ended: float = 0.0
    sent: int = 0
    client_closed: bool = False  # the client hung up before the fault was done


class Conn:
    """The server side of one connection, as seen by a fault."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hit: HostileHit
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.hit = hit

    async def send(self, data: bytes) -> None:
        """Write and drain; raises ConnectionError when the client has gone."""
        if self.writer.is_closing() or self.reader.at_eof():
            raise ConnectionResetError("the client hung up")
        self.writer.write(data)
        await self.writer.drain()
        self.hit.sent += len(data)

    async def wait_for_client_close(self, timeout: float = 120.0) -> None:
        """Read until the client hangs up (or the timeout, a safety net for a broken test)."""
        try:
            async with asyncio.timeout(timeout):
                while await self.reader.read(65536):
                    pass
        except (TimeoutError, ConnectionError):
            return
        self.hit.client_closed = True

    def reset(self) -> None:
        """Abort the connection with a TCP RST (SO_LINGER 0)."""
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


Fault = Callable[[Conn, Request], Awaitable[None]]


def response(status: str, headers: Mapping[str, str], body: bytes = b"") -> bytes:
    """A raw HTTP/1.1 response (Connection: close)."""
    head = f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1") + b"Connection: close\r\n\r\n" + body


def page(
    body: bytes | str, content_type: str = "text/html", status: str = "200 OK", **headers: str
) -> bytes:
    """A complete, well-formed response with a Content-Length."""
    data = body.encode() if isinstance(body, str) else body
    hdrs = {"Content-Type": content_type, "Content-Length": str(len(data))}
    hdrs |= {k.replace("_", "-"): v for k, v in headers.items()}
    return response(status, hdrs, data)


def link_page(links: list[str], text: str = "") -> bytes:
    """A page with these links (and text); a unique title, so never a duplicate of another."""
    anchors = "".join(f'<a href="{h}">x</a>' for h in links)
    return page(f"<html><head><title>{os.urandom(8).hex()}</title></head>"
                f"<body>{text}{anchors}</body></html>")


# -- faults ------------------------------------------------------------------------------------
def fixed(raw: bytes) -> Fault:
    """Send these bytes, then close."""

    async def fault(conn: Conn, req: Request) -> None:
        await conn.send(raw)

    return fault


def routes(table: Mapping[str, bytes | Fault], default: Fault | None = None) -> Fault:
    """Dispatch on the path: raw bytes are sent as they are, a Fault is run."""

    async def fault(conn: Conn, req: Request) -> None:
        entry = table.get(req.path)
        if entry is None:
            entry = default or fixed(page("not found", "text/plain", "404 Not Found"))
        if isinstance(entry, bytes):
            await conn.send(entry)
        else:
            await entry(conn, req)

    return fault


def kept_alive(table: Mapping[str, bytes]) -> Fault:
    """Answer every request on the connection by its path (raw bytes, sent as they are) until
    the client hangs up: a server that keeps connections alive (only the first request of
    each connection is a hit)."""

    async def fault(conn: Conn, req: Request | None) -> None:
        while req is not None:
            await conn.send(table.get(req.path) or page("not found", "text/plain",
                                                        "404 Not Found"))
            req = await _read_request(conn.reader)

    return fault


async def silent(conn: Conn, req: Request) -> None:
    """Read the request, never answer."""
    await conn.wait_for_client_close()


def drip(interval: float, length: int = 100_000) -> Fault:
    """Headers at once, then one byte of body every `interval` seconds."""

    async def fault(conn: Conn, req: Request) -> None:
        await conn.send(
            response("200 OK", {"Content-Type": "text/html", "Content-Length": str(length)})
        )
        for _ in range(length):
            await asyncio.sleep(interval)
            await conn.send(b"x")

    return fault


def stall_after_headers(body_part: bytes = b"<html><body>") -> Fault:
    """Headers and the start of the body, then silence."""

    async def fault(conn: Conn, req: Request) -> None:
        await conn.send(
            response("200 OK", {"Content-Type": "text/html", "Content-Length": "100000"})
            + body_part
        )
        await conn.wait_for_client_close()

    return fault


def endless(
    chunked: bool = True,
    declared: int | None = None,
    total: int = 1 << 40,
    content_type: str = "text/html",
) -> Fault:
    """A body of zeros (chunked, or with a declared length) until `total` bytes or a hang-up."""

    async def fault(conn: Conn, req: Request) -> None:
        headers = {"Content-Type": content_type}
        if chunked:
            headers["Transfer-Encoding"] = "chunked"
        elif declared is not None:
            headers["Content-Length"] = str(declared)
        await conn.send(response("200 OK", headers))
        block = b"<p>" + b"a" * (64 * 1024 - 7) + b"</p>"
        frame = f"{len(block):x}\r\n".encode() + block + b"\r\n" if chunked else block
        sent = 0
        while sent < total:
            await conn.send(frame)
            sent += len(block)
        if chunked:
            await conn.send(b"0\r\n\r\n")

    return fault


@functools.cache
def gzip_bomb(decompressed: int) -> bytes:
    """One gzip member inflating to `decompressed` zero bytes (a thousandth of that on the wire)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\0" * (1 << 20)
    parts = [comp.compress(block) for _ in range(decompressed // len(block))]
    parts.append(comp.compress(b"\0" * (decompressed % len(block))))
    return b"".join(parts) + comp.flush()


def header_flood(count: int, value_size: int = 20) -> bytes:
    """A response with `count` headers."""
    hdrs = "".join(f"X-Flood-{i}: {'v' * value_size}\r\n" for i in range(count))
    return (
        f"HTTP/1.1 200 OK\r\n{hdrs}Content-Type: text/html\r\nContent-Length: 2\r\n"
        "Connection: close\r\n\r\nok"
    ).encode()


async def reset_mid_body(conn: Conn, req: Request) -> None:
    """Half the declared body, then a TCP reset."""
    await conn.send(
        response("200 OK", {"Content-Type": "text/html", "Content-Length": "5000"})
        + b"<html>"
        + b"a" * 2000
    )
    await asyncio.sleep(0.05)
    conn.reset()


async def close_at_once(conn: Conn, req: Request) -> None:
    """Read the request and hang up without a byte."""


# -- traps -------------------------------------------------------------------------------------
async def calendar(conn: Conn, req: Request) -> None:
    """/cal/Y/M/ links the previous and the next month and the next year, forever."""
    parts = req.path.strip("/").split("/")
    year, month = (int(parts[1]), int(parts[2])) if len(parts) == 3 else (2026, 11)
    nxt = (year + month // 12, month % 12 + 1)
    prv = (year - (month == 1), (month - 2) % 12 + 1)
    links = [f"/cal/{y}/{m:02d}/" for y, m in (prv, nxt, (year + 1, month))]
    await conn.send(link_page(links))


async def session_ids(conn: Conn, req: Request) -> None:
    """Every page links itself and one other page with a fresh session id, in both forms."""
    sid = os.urandom(8).hex()
    await conn.send(link_page([f"/?sid={sid}", f"/about;jsessionid={sid}",
                               f"/cart?PHPSESSID={sid}&item=1"]))


async def redirect_forever(conn: Conn, req: Request) -> None:
    """/r/N redirects to /r/N+1."""
    n = int(req.path.rsplit("/", 1)[1] or 0) if req.path.startswith("/r/") else 0
    await conn.send(response("302 Found", {"Location": f"/r/{n + 1}", "Content-Length": "0"}))


async def repeating_paths(conn: Conn, req: Request) -> None:
    await conn.send(link_page(["a/"]))  # relative: /a/a/a/a/ ... forever


# -- the server --------------------------------------------------------------------------------
@dataclass
class HostileServer(BackgroundServer):
    """Serves {origin name: fault} on 127.0.0.1, one port per origin, in a background thread."""

    faults: Mapping[str, Fault]
    origins: dict[str, str] = field(default_factory=dict)  # name -> "http://127.0.0.1:PORT"
    hits: list[HostileHit] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._servers: list[asyncio.Server] = []
        self._conns: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._open_loop()

    def hits_for(self, name: str, robots: bool = False) -> list[HostileHit]:
        """Requests to one origin in arrival order (robots.txt left out unless asked)."""
        origin = self.origins[name]
        return sorted(
            (h for h in self.hits if h.origin == origin and (robots or h.path != "/robots.txt")),
            key=lambda h: h.arrived,
        )

    async def _start(self) -> None:
        for name, fault in self.faults.items():
            server = await asyncio.start_server(
                functools.partial(self._serve, name, fault),
                "127.0.0.1",
                0,
                limit=1 << 20,
            )
            port = server.sockets[0].getsockname()[1]
            self.origins[name] = f"http://127.0.0.1:{port}"
            self._servers.append(server)

    async def _stop(self) -> None:
        for server in self._servers:
            server.close()
        for writer in self._conns.values():
            writer.transport.abort()  # every fault then ends on its own
        if self._conns:
            _, pending = await asyncio.wait(list(self._conns), timeout=2)
            for task in pending:
                task.cancel()

    async def _serve(
        self, name: str, fault: Fault, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns[task] = writer
        try:
            req = await _read_request(reader)
            if req is None:
                return
            hit = HostileHit(self.origins[name], req.path, time.monotonic())
            self.hits.append(hit)
            conn = Conn(reader, writer, hit)
            try:
                if req.path == "/robots.txt" and not _maps_robots(fault):
                    await conn.send(page("", "text/plain", "404 Not Found"))
                else:
                    await fault(conn, req)
            except (ConnectionError, OSError):
                hit.client_closed = True
            finally:
                hit.ended = time.monotonic()
        except (
            ConnectionError,
            OSError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            asyncio.CancelledError,
        ):
            pass
        finally:
            self._conns.pop(task, None)
            if not writer.is_closing():
                writer.close()


def serves_robots(fault: Fault) -> Fault:
    """Mark a fault as answering /robots.txt itself."""
    fault.serves_robots = True  # type: ignore[attr-defined]
    return fault


def _maps_robots(fault: Fault) -> bool:
    return bool(getattr(fault, "serves_robots", False))


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) < 2:
        return None
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    return Request(parts[0], parts[1], headers)
