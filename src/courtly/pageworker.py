"""The CPU work on one HTML page, in a worker process (the crawl loop's second core).

`analyse_page` is a pure function of the body and the settings: parse the HTML, read the
directives, resolve and normalize the links, compute the near-duplicate signature, compress the
body for storage. The crawler calls it through a `PageWorker`: in one worker process
(`parse_workers = 1`), or inline on the event-loop thread (`parse_workers = 0`). Both paths run
the same function.

The worker is `python -c ...serve(FD)`, a direct child (its CPU time is counted in the
crawler's when it is reaped), talking over a socket pair: length-prefixed pickles, answered in
order. On the crawler's side the socket is an asyncio stream, so a page costs the event loop one
write and one read, with no thread. The worker ignores SIGINT (the crawler handles Ctrl-C and
closes the socket) and exits at end of file, which is also what happens when the crawler is
killed: no orphan. If the worker dies, its pages are analysed inline and a new one is started
(MAX_RESTARTS times in a run); a page the worker fails on is analysed inline too, so an error
surfaces exactly as without a worker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import zstandard

from courtly import dedup
from courtly.config import Normalize
from courtly.parse import parse_html, robots_directives
from courtly.urls import normalize

log = logging.getLogger("courtly")

#: the worker is replaced this many times in a run; after that pages are analysed inline
MAX_RESTARTS = 3
_HEAD = 4  # bytes of the little-endian length before each message
_ZSTD = zstandard.ZstdCompressor(level=3)
_WORKER = (
    "import sys, socket, courtly.pageworker as w; w.serve(socket.socket(fileno=int(sys.argv[1])))"
)
#: glibc gave the heap back to the system after every page and took it again (page faults: a
#: quarter of the worker's CPU, bench/RESULTS.md); NumPy's BLAS threads are never used here
_WORKER_ENV = {
    "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=33554432",
    "OPENBLAS_NUM_THREADS": "1",
}


@dataclass(frozen=True, slots=True)
class PageSettings:
    """What analyse_page needs from the configuration (sent to the worker once)."""

    token: str
    max_links: int
    max_parse_size: int
    near: bool  # compute the near-duplicate signature
    normalize: Normalize
    compress: bool  # compress the body for storage


@dataclass(slots=True)
class PageAnalysis:
    """The result of the CPU work on one HTML page (picklable)."""

    noindex: bool = False
    nofollow: bool = False
    #: the normalized canonical URL when it names another page (the page is then discarded)
    canonical: str | None = None
    title: str | None = None
    #: (normalized URL, anchor text) of the followable links, in page order, without repeats
    #: or the page itself; empty when the page is nofollow
    links: list[tuple[str, str]] = field(default_factory=list)
    near_signature: bytes | None = None
    #: the body compressed for the content table (settings.compress), unless noindex
    content: bytes | None = None


def compress(body: bytes) -> bytes:
    """A body as the content table stores it: zstd, level 3."""
    return _ZSTD.compress(body)


def analyse_page(
    settings: PageSettings, url: str, body: bytes, content_type: str | None, x_robots_tag: str
) -> PageAnalysis:
    """Parse one HTML page: directives, canonical, normalized links, near-duplicate signature."""
    page = parse_html(
        body, content_type, settings.token, settings.max_links, want_text=settings.near,
        max_bytes=settings.max_parse_size,
    )
    noindex, nofollow = robots_directives(x_robots_tag, settings.token)
    out = PageAnalysis(noindex | page.noindex, nofollow | page.nofollow, title=page.title)
    base = normalize(page.base, url) if page.base else None
    base = base or url
    opts = settings.normalize
    if page.canonical:
        canonical = normalize(page.canonical, base, opts)
        if canonical and canonical != url:
            out.canonical = canonical
            return out
    if settings.near and not out.noindex:
        out.near_signature = dedup.signature(page.text)
    if settings.compress and not out.noindex:
        out.content = compress(body)
    if out.nofollow:
        return out
    seen: set[str] = set()
    links = out.links
    for link in page.links:
        if link.nofollow:
            continue
        target = normalize(link.href, base, opts)
        if target is None or target in seen or target == url:
            continue
        seen.add(target)
        links.append((target, link.text))
    return out


# -- the worker process ------------------------------------------------------------------------
def serve(sock: socket.socket) -> None:
    """Answer analysis requests in order until end of file (the crawler closed or died)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the crawler stops us by closing the socket
    stream = sock.makefile("rb")
    settings: PageSettings | None = None
    with contextlib.suppress(OSError):  # the crawler is gone
        while True:
            head = stream.read(_HEAD)
            if len(head) < _HEAD:
                return
            data = stream.read(int.from_bytes(head, "little"))
            if settings is None:
                settings = pickle.loads(data)
                continue
            try:
                out = pickle.dumps(analyse_page(settings, *pickle.loads(data)), protocol=5)
            except Exception:  # the crawler analyses this page inline, and sees why
                out = b""
            sock.sendall(len(out).to_bytes(_HEAD, "little") + out)


# -- in the crawler ----------------------------------------------------------------------------
class _Connection:
    """One worker process and the pages waiting for its answers (answered in order)."""

    def __init__(
        self, proc: subprocess.Popen[bytes], sock: socket.socket, writer: asyncio.StreamWriter
    ) -> None:
        self.proc = proc
        self.sock = sock  # the transport's own socket (uvloop's wrapper has no shutdown)
        self.writer = writer
        self.waiting: collections.deque[asyncio.Future[bytes]] = collections.deque()
        self.reader: asyncio.Task[None] | None = None
        self.closed = False

    def send(self, message: object) -> asyncio.Future[bytes] | None:
        data = pickle.dumps(message, protocol=5)
        self.writer.write(len(data).to_bytes(_HEAD, "little"))
        self.writer.write(data)
        if isinstance(message, PageSettings):
            return None
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        return future

    def close(self) -> None:
        """Close the socket (the worker exits at end of file) and reap it; kill it after 2 s."""
        self.closed = True
        with contextlib.suppress(OSError):  # end of file for the worker now, not on next turn
            self.sock.shutdown(socket.SHUT_RDWR)
        self.writer.close()
        try:
            self.proc.wait(2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        while self.waiting:  # unanswered pages are analysed inline
            future = self.waiting.popleft()
            if not future.done():
                future.set_result(b"")


class PageWorker:
    """Runs analyse_page in a worker process (workers = 1) or inline (workers = 0)."""

    def __init__(self, settings: PageSettings, workers: int) -> None:
        self.settings = settings
        self.workers = workers
        self.restarts = 0
        self._conn: _Connection | None = None
        self._starting = asyncio.Lock()

    async def analyse(
        self, url: str, body: bytes, content_type: str | None, x_robots_tag: str
    ) -> PageAnalysis:
        """The analysis of one page; a dead worker is replaced, its pages analysed inline."""
        body = body[: self.settings.max_parse_size + 1]  # parse_html reads no further
        if self.workers > 0:
            try:
                data = await self._ask((url, body, content_type, x_robots_tag))
            except OSError:  # the worker is gone (its reader task starts a new one)
                data = b""
            if data:  # empty: the worker failed on this page or died before answering
                result: PageAnalysis = pickle.loads(data)
                return result
        return analyse_page(self.settings, url, body, content_type, x_robots_tag)

    async def _ask(self, request: tuple[str, bytes, str | None, str]) -> bytes:
        conn = self._conn
        if conn is None:
            async with self._starting:
                conn = self._conn or await self._start()
        if conn is None or conn.closed:
            return b""
        future = conn.send(request)
        assert future is not None
        await conn.writer.drain()  # bounded memory: waits while the worker is behind
        return await future

    async def _start(self) -> _Connection | None:
        if self.workers <= 0:
            return None
        ours, theirs = socket.socketpair()
        env = dict(os.environ)  # find this courtly even if it is not the installed one
        package_root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        for name, value in _WORKER_ENV.items():
            env.setdefault(name, value)  # the user's own settings win
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER, str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env,
            )
        except OSError as exc:
            ours.close()
            self.workers = 0
            log.warning("cannot start the page worker (%s): analysing pages inline", exc)
            return None
        finally:
            theirs.close()
        reader, writer = await asyncio.open_connection(sock=ours)
        conn = self._conn = _Connection(proc, ours, writer)
        conn.send(self.settings)
        conn.reader = asyncio.create_task(self._read(conn, reader))
        return conn

    async def _read(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        """Hand the worker's answers to the pages waiting for them, in order."""
        with contextlib.suppress(asyncio.IncompleteReadError, OSError):
            while True:
                head = await reader.readexactly(_HEAD)
                data = await reader.readexactly(int.from_bytes(head, "little"))
                future = conn.waiting.popleft()
                if not future.done():  # a cancelled page's answer is dropped
                    future.set_result(data)
        if conn.closed:
            return
        # end of file while running: the worker died
        self._conn = None
        conn.close()
        self.restarts += 1
        if self.restarts > MAX_RESTARTS:
            self.workers = 0
            log.warning("page worker died %d times: analysing pages inline", self.restarts)
        else:
            log.warning("page worker died (exit status %s): starting a new one",
                        conn.proc.returncode)

    def close(self) -> None:
        """Stop the worker (the crawl is over)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            if conn.reader is not None:
                conn.reader.cancel()
