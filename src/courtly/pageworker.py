"""The page worker, from the crawler's side: a page's CPU work (`analysis.analyse_page`) in a
worker process (the crawl loop's second core).

The crawler calls it through a `PageWorker`: in one worker process (`parse_workers = 1`), or
inline on the event-loop thread (`parse_workers = 0`). Both paths run the same function.

The worker is `python -c ...analysis.serve(FD)`, a direct child (its CPU time is counted in the
crawler's when it is reaped), talking over a socket pair: length-prefixed pickles, answered in
order. On the crawler's side the socket is an asyncio protocol, so a page costs the event loop
one write and one read, with no thread and no reader task. The worker ignores SIGINT (the
crawler handles Ctrl-C and closes the socket) and exits at end of file, which is also what
happens when the crawler is killed: no orphan. If the worker dies, its pages are analysed inline
and a new one is started (MAX_RESTARTS times in a run); a page the worker fails on is analysed
inline too, so an error surfaces exactly as without a worker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import pickle
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from courtly.analysis import LENGTH, PageAnalysis, PageSettings, analyse_page
from courtly.config import Limits

log = logging.getLogger("courtly")

#: the worker is replaced this many times in a run; after that pages are analysed inline
MAX_RESTARTS = 3
_WORKER = (
    "import sys, socket, courtly.analysis as w; w.serve(socket.socket(fileno=int(sys.argv[1])))"
)
#: glibc gave the heap back to the system after every page and took it again (page faults: a
#: quarter of the worker's CPU, bench/RESULTS.md); a fixed trim threshold also fixes glibc's
#: mmap threshold at 128 KiB, so lexbor's two 324 KiB blocks a page were mmap'd and unmapped
#: each time: blocks up to 4 MiB come from the heap. NumPy's BLAS threads are never used here
_WORKER_ENV = {
    "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=33554432:glibc.malloc.mmap_threshold=4194304",
    "OPENBLAS_NUM_THREADS": "1",
}



# -- in the crawler ----------------------------------------------------------------------------
class TooComplex(Exception):
    """The worker spent more than limits.max_parse_seconds on a page: it was replaced."""


class _Replaced(Exception):
    """The worker was replaced (TooComplex) before it answered this page: ask the next one."""


class _WorkerChannel(asyncio.Protocol):
    """One worker process: requests written to its socket, answers handed out in order.

    An asyncio protocol rather than streams: an answer resolves its page's future straight from
    `data_received`, with no reader task to wake.
    """

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket,
                 on_lost: Callable[[_WorkerChannel], None], max_seconds: float) -> None:
        self.proc = proc
        self.sock = sock  # the transport's own socket (uvloop's wrapper has no shutdown)
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()  # kept: 3.11 asks getpid() on every lookup
        self.waiting: collections.deque[asyncio.Future[bytes]] = collections.deque()
        self.closed = False
        self._buffer = bytearray()
        self._writable: asyncio.Future[None] | None = None  # set while the socket is full
        self._on_lost = on_lost
        # the watchdog: the worker began the oldest unanswered page at `_began` (it answers in
        # order); past max_seconds on it, the worker is killed (a parser's worst case cannot be
        # interrupted from Python, and no guard before parsing knows every slow markup)
        self.max_seconds = max_seconds
        self.too_slow = False  # killed by the watchdog: what it still sends is not read
        self.starting = True  # until the worker answers its settings: no page is timed yet
        self._began = 0.0
        self._watch: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.too_slow:
            return
        buffer = self._buffer
        buffer += data
        while len(buffer) >= LENGTH:
            end = LENGTH + int.from_bytes(buffer[:LENGTH], "little")
            if len(buffer) < end:
                return
            answer = bytes(buffer[LENGTH:end])
            del buffer[:end]
            future = self.waiting.popleft()
            self.starting = False
            self._began = self.loop.time()  # the next page's turn
            if not future.done():  # a cancelled page's answer is dropped
                future.set_result(answer)

    def _check(self) -> None:
        """The watchdog: kill a worker past max_seconds on its page; else look again then."""
        self._watch = None
        if self.closed or not self.waiting:
            return
        due = self._began + self.max_seconds
        if self.starting:  # the process is still starting (a slow machine: seconds)
            due = self.loop.time() + self.max_seconds
        if self.loop.time() < due:
            self._watch = self.loop.call_at(due, self._check)
            return
        self.too_slow = True
        page = self.waiting.popleft()
        if not page.done():
            page.set_exception(TooComplex(
                f"the page worker spent over {self.max_seconds:g} s on this page (markup slow "
                "to parse): replaced"))
        with contextlib.suppress(OSError):
            self.proc.kill()
        self._on_lost(self)  # replaced now: no page goes to it any more

    def connection_lost(self, exc: Exception | None) -> None:
        self.resume_writing()
        self._on_lost(self)

    def pause_writing(self) -> None:
        self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def send(self, message: object) -> asyncio.Future[bytes] | None:
        assert self.transport is not None
        data = pickle.dumps(message, protocol=5)
        self.transport.write(len(data).to_bytes(LENGTH, "little") + data)
        future: asyncio.Future[bytes] = self.loop.create_future()
        if not self.waiting:
            self._began = self.loop.time()
        self.waiting.append(future)  # the settings' answer: the worker is ready
        if isinstance(message, PageSettings):
            return None
        if self._watch is None:
            self._watch = self.loop.call_at(self._began + self.max_seconds, self._check)
        return future

    async def drain(self) -> None:
        """Wait while the worker is behind (bounded memory)."""
        if self._writable is not None:
            await asyncio.shield(self._writable)

    def close(self) -> None:
        """Close the socket (the worker exits at end of file) and reap it; kill it after 2 s."""
        self.closed = True
        with contextlib.suppress(OSError):  # end of file for the worker now, not on next turn
            self.sock.shutdown(socket.SHUT_RDWR)
        if self.transport is not None:
            self.transport.close()
        try:
            self.proc.wait(2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        while self.waiting:  # unanswered pages: asked again (replaced), or analysed inline
            future = self.waiting.popleft()
            if not future.done():
                if self.too_slow:
                    future.set_exception(_Replaced())
                else:
                    future.set_result(b"")


#: what the worker is sent: analyse_page's arguments after its settings
_Request = tuple[str, bytes, str | None, str, bytes, str, bool]


def _request(settings: PageSettings, url: str, body: bytes, content_type: str | None,
             x_robots_tag: str, exchange: bytes, link: str, own: bool) -> _Request:
    """A page as the worker is sent it (parse_html reads no further than max_parse_size)."""
    return (url, body[: settings.max_parse_size + 1], content_type, x_robots_tag, exchange, link,
            own)


@dataclass(slots=True)
class SentPage:
    """A page the worker is analysing (PageWorker.send): its answer, read by PageWorker.result."""

    conn: _WorkerChannel
    request: _Request
    answer: asyncio.Future[bytes]

    def cancel(self) -> None:
        """Its answer is not wanted (it is dropped when it comes)."""
        self.answer.cancel()


class PageWorker:
    """Runs analyse_page in a worker process (workers = 1) or inline (workers = 0)."""

    def __init__(self, settings: PageSettings, workers: int,
                 max_seconds: float = Limits.model_fields["max_parse_seconds"].default) -> None:
        self.settings = settings
        self.workers = workers
        self.max_seconds = max_seconds  # a page's time in the worker (TooComplex past it)
        self.restarts = 0
        self._conn: _WorkerChannel | None = None
        self._starting = asyncio.Lock()

    async def analyse(
        self, url: str, body: bytes, content_type: str | None, x_robots_tag: str,
        exchange: bytes = b"", link: str = "", own: bool = False,
    ) -> PageAnalysis:
        """The analysis of one page (analyse_page's arguments); a dead worker is replaced, its
        pages analysed inline (TooComplex: the worker spent too long on this one)."""
        return await self._asked(_request(self.settings, url, body, content_type, x_robots_tag,
                                          exchange, link, own))

    async def _asked(self, request: _Request) -> PageAnalysis:
        while True:
            data = b""
            if self.workers > 0:
                try:
                    data = await self._ask(request)
                except OSError:  # the worker is gone (the next page starts one)
                    pass
                except _Replaced:  # another page was too slow: the next worker's
                    continue
            return self._answer(request, data)

    def send(self, url: str, body: bytes, content_type: str | None, x_robots_tag: str,
             exchange: bytes = b"", link: str = "", own: bool = False) -> SentPage | None:
        """A page sent to the running worker now, its analysis read later by `result` (no task
        between: one a page cost 15,000 instructions); None: no worker runs yet (`analyse`)."""
        conn = self._conn
        if conn is None or conn.closed:
            return None
        request = _request(self.settings, url, body, content_type, x_robots_tag, exchange, link,
                           own)
        answer = conn.send(request)
        assert answer is not None
        return SentPage(conn, request, answer)

    async def result(self, page: SentPage) -> PageAnalysis:
        """The analysis of a page `send` sent (TooComplex: the worker spent too long on it)."""
        try:
            await page.conn.drain()
            data = await page.answer
        except OSError:
            data = b""
        except _Replaced:  # another page was too slow: the next worker's
            return await self._asked(page.request)
        return self._answer(page.request, data)

    def _answer(self, request: _Request, data: bytes) -> PageAnalysis:
        """The worker's answer; empty: it failed on this page or died before answering, and
        the page is analysed inline."""
        if data:
            return PageAnalysis(*pickle.loads(data))
        return analyse_page(self.settings, *request)

    async def _ask(self, request: _Request) -> bytes:
        conn = self._conn
        if conn is None:
            async with self._starting:
                conn = self._conn or await self._start()
        if conn is None or conn.closed:
            return b""
        future = conn.send(request)
        assert future is not None
        await conn.drain()
        return await future

    async def _start(self) -> _WorkerChannel | None:
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
        conn = _WorkerChannel(proc, ours, self._lost, self.max_seconds)
        await asyncio.get_running_loop().create_connection(lambda: conn, sock=ours)
        self._conn = conn
        conn.send(self.settings)
        return conn

    def _lost(self, conn: _WorkerChannel) -> None:
        """End of file from a worker: expected after close; else it died and is replaced."""
        if conn.closed:
            return
        if self._conn is conn:
            self._conn = None
        conn.close()
        if conn.too_slow:  # not a failing worker: a page's markup (the next page starts one)
            log.warning("page worker replaced: over %g s on one page", conn.max_seconds)
            return
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
