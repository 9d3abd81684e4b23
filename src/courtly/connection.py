"""One HTTP/1.1 client connection: a GET written, its response parsed by httptools (llhttp).

Written on asyncio's Protocol rather than through aiohttp's ClientSession, which spent about
350,000 instructions a request in generic machinery (12 % of a crawl's CPU, bench/RESULTS.md);
the parsing, the hard part, is llhttp's, the parser aiohttp and Node.js use.

A response is read with its limits as it arrives: the head (header count and line size), the
body (declared or received bytes over the limit: refused or, with truncate, cut there), the
decoded size (Decoder), and the timeouts (first byte, then total; read-idle). Every fault
fails the request's future with one FetchError; the caller closes a connection that did not
end its response cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import re
import zlib
from typing import TYPE_CHECKING, Any

import brotli
import httptools
import zstandard

from courtly.errors import FetchError, LocalError
from courtly.model import ExitCode

if TYPE_CHECKING:
    from courtly.config import Limits
    from courtly.pool import Slot

#: what a response turns into: status, headers (lower-case names, repeats joined), body, and
#: the head as received (status line and header lines in their order and case, see `head`)
Answer = tuple[int, dict[str, str], bytes, bytes]


#: errno values that mean courtly's own machine is out of something, not that the site failed
LOCAL_ERRNOS = frozenset(
    getattr(errno, name) for name in ("EMFILE", "ENFILE", "ENOBUFS", "ENOMEM", "ENOSPC", "EDQUOT")
    if hasattr(errno, name)
)


def is_local(exc: BaseException | None) -> bool:
    """True for an OSError of courtly's own machine (out of descriptors, buffers, memory, disk)."""
    return isinstance(exc, OSError) and exc.errno in LOCAL_ERRNOS


_KEEP_ALIVE_TIMEOUT = re.compile(r"timeout\s*=\s*(\d+(?:\.\d+)?)", re.I)


def keep_alive_timeout(header: str) -> float | None:
    """The `timeout=` of a Keep-Alive header (seconds the server keeps an idle connection)."""
    match = _KEEP_ALIVE_TIMEOUT.search(header)
    return float(match.group(1)) if match else None


#: the media types of an XML sitemap; with a feed's, an uncompressed body of theirs may have
#: `limits.max_decompressed_size` (sitemaps.org's 50 MB), other bodies `max_body_size`
XML_TYPES = ("text/xml", "application/xml", "application/x-xml")
_SITEMAP_SIZED = (*XML_TYPES, "application/rss+xml", "application/atom+xml")


def media_type(content_type: str | None) -> str:
    """A Content-Type's media type, lower case, without its parameters."""
    return (content_type or "").split(";")[0].strip().lower()


def deadline_error(first_byte: float, total: float, head_done: bool) -> FetchError:
    """The timeout of a fetch that reached its deadline: the first byte's, or the total's."""
    if first_byte < total and not head_done:
        return FetchError(ExitCode.TIMEOUT, f"first-byte timeout ({first_byte}s)")
    return FetchError(ExitCode.TIMEOUT, f"total timeout ({total}s)")


class _Full(Exception):
    """A zstd layer's output reached its room: the rest is not decompressed."""


class _Sink:
    """Where a zstd stream writer puts its output, up to `room` bytes."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.room = 0

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        self.room -= len(data)
        if self.room <= 0:
            raise _Full
        return len(data)

    def taken(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE = 0x184D2A50  # the magic of a skippable frame, its low 4 bits any


class _ZstdFrames:
    """Whether a zstd body so far ends where a frame does (RFC 8878 §3.1), read from the frame
    and block headers as the body arrives: the decompressor does not tell."""

    def __init__(self) -> None:
        self._part = "magic"  # the header part wanted next
        self._need = 4  # its size
        self._head = b""  # what came of it so far
        self._skip = 0  # content bytes to pass over first
        self._checksum = False  # the frame ends with a checksum

    @property
    def ended(self) -> bool:
        """The body so far is whole frames."""
        return self._part == "magic" and not self._head and not self._skip

    def feed(self, data: bytes) -> None:
        """Pass over these bytes of the body."""
        at = 0
        while at < len(data):
            if self._skip:
                passed = min(self._skip, len(data) - at)
                self._skip -= passed
                at += passed
                continue
            taken = data[at:at + self._need - len(self._head)]
            self._head += taken
            at += len(taken)
            if len(self._head) == self._need:
                self._read(int.from_bytes(self._head, "little"))
                self._head = b""

    def _read(self, value: int) -> None:
        part = self._part
        if part == "magic":
            if value & ~0xF == _ZSTD_SKIPPABLE:
                self._part = "skippable"
            elif value == _ZSTD_MAGIC:
                self._part, self._need = "descriptor", 1
            else:  # not zstd: the decompressor says so
                self._part, self._skip = "garbage", 1 << 62
        elif part == "skippable":
            self._part, self._skip = "magic", value
        elif part == "descriptor":
            single = value >> 5 & 1
            self._checksum = bool(value >> 2 & 1)
            self._need = (1 - single + (0, 1, 2, 4)[value & 3]  # window, dictionary id
                          + (single, 2, 4, 8)[value >> 6])  # content size
            self._part = "frame header"
        elif part == "frame header":
            self._part, self._need = "block", 3
        elif part == "block":  # last block: bit 0; type: bits 1-2 (1: RLE, one byte); size
            self._skip = 1 if value >> 1 & 3 == 1 else value >> 3
            if value & 1:
                self._part, self._need = ("checksum", 4) if self._checksum else ("magic", 4)
        else:  # the checksum
            self._part = "magic"


#: a zstd frame's largest window: RFC 9659 caps the content coding's at 8 MB (a frame asking
#: more would make the decoder allocate it)
_ZSTD_WINDOW = 8 << 20


class Decoder:
    """Content-Encoding decoder with a cap on the decoded size (a bomb is cut off, not inflated):
    courtly's one decompressor, for response bodies and for gzipped sitemap files. Codings
    applied in turn (`gzip, gzip`) are undone in turn, each layer capped.

    Past the limit, feed() raises TOO_LARGE; with truncate, it returns the first `limit` bytes
    and nothing after. `cut_short` tells a body that ended inside a compressed stream (which
    decodes without error as far as it goes).
    """

    def __init__(self, encoding: str, limit: int, truncate: bool = False) -> None:
        self.limit = limit
        self.truncate = truncate
        self.made = 0  # this layer's output
        self._fed = False  # this layer was given input
        self._zlib: Any = None
        self._brotli: Any = None
        self._zstd: Any = None
        codings = [c for c in (c.strip() for c in encoding.lower().split(","))
                   if c not in ("", "identity")]
        coding = codings.pop() if codings else ""  # the last applied, undone first
        #: the layer that undoes the codings applied before this one's
        self._then = Decoder(", ".join(codings), limit, truncate) if codings else None
        if coding in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        elif coding == "deflate":
            self._zlib = zlib.decompressobj(wbits=zlib.MAX_WBITS)  # zlib; raw deflate on retry
            self._raw_fallback = True
        elif coding == "br":
            self._brotli = brotli.Decompressor()
        elif coding == "zstd":  # not asked for, but a Chrome's server may send it
            self._sink = _Sink()
            self._frames = _ZstdFrames()
            self._zstd = zstandard.ZstdDecompressor(max_window_size=_ZSTD_WINDOW).stream_writer(
                self._sink)  # type: ignore[arg-type]  # it calls write() alone
        elif coding:
            raise FetchError(ExitCode.PROTOCOL_ERROR, f"unsupported Content-Encoding: {encoding}")

    @property
    def size(self) -> int:
        """The decoded body's bytes so far."""
        return self.made if self._then is None else self._then.size

    @property
    def cut_short(self) -> bool:
        """The input so far ends inside a compressed stream (in this layer or one it feeds)."""
        if self._zlib is not None:
            ended = self._zlib.eof
        elif self._brotli is not None:
            ended = self._brotli.is_finished()
        elif self._zstd is not None:
            ended = self._frames.ended
        else:
            ended = True
        return (self._fed and not ended) or (self._then is not None and self._then.cut_short)

    def feed(self, data: bytes) -> bytes:
        """Decode one chunk; raise TOO_LARGE past the limit, PROTOCOL_ERROR on garbage."""
        self._fed = self._fed or bool(data)
        try:
            if self._zlib is not None:
                out = self._inflate(data)
            elif self._brotli is not None:
                out = self._brotli.process(data, output_buffer_limit=self.limit - self.made + 1)
            elif self._zstd is not None:
                out = self._unzstd(data)
            else:
                out = data
            assert isinstance(out, bytes)
        except (zlib.error, brotli.error, zstandard.ZstdError) as exc:
            raise FetchError(ExitCode.PROTOCOL_ERROR, f"bad compressed body: {exc}") from None
        if self.truncate and self.made + len(out) > self.limit:
            out = out[: self.limit - self.made]
        self._count(len(out))
        return out if self._then is None else self._then.feed(out)

    def _count(self, n: int) -> None:
        self.made += n
        if self.made > self.limit:
            raise FetchError(
                ExitCode.TOO_LARGE, f"decompressed body over {self.limit} bytes (cut off)"
            )

    def _unzstd(self, data: bytes) -> bytes:
        self._sink.room = self.limit - self.made + 1
        with contextlib.suppress(_Full):  # over the limit: the caller raises TOO_LARGE
            self._zstd.write(data)
        self._frames.feed(data)
        return self._sink.taken()

    def _inflate(self, data: bytes) -> bytes:
        out: list[bytes] = []
        produced = 0
        while data:
            room = self.limit - self.made - produced + 1
            try:
                chunk = self._zlib.decompress(data, room)
            except zlib.error:
                if self.made or produced or not getattr(self, "_raw_fallback", False):
                    raise
                self._raw_fallback = False  # "deflate" sent as raw deflate, not zlib
                self._zlib = zlib.decompressobj(wbits=-zlib.MAX_WBITS)
                continue
            out.append(chunk)
            produced += len(chunk)
            if len(chunk) >= room:
                break  # over the limit: the caller raises TOO_LARGE
            if self._zlib.unconsumed_tail:
                data = self._zlib.unconsumed_tail
            elif self._zlib.eof and self._zlib.unused_data.lstrip(b"\0"):
                # another gzip member (concatenated members are one gzip stream)
                data = self._zlib.unused_data
                self._zlib = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            else:
                data = b""
        return b"".join(out)


#: an obs-fold (RFC 9112 §5.2): a header line's end followed by whitespace, with the whitespace
#: about it
_OBS_FOLD = re.compile(rb"[ \t]*\r\n[ \t]+")


def unfold(data: bytes) -> bytes:
    """The response heads in `data` (1xx interim ones, then the final one) with each obs-fold
    replaced by one SP, as a user agent must (RFC 9112 §5.2; llhttp refuses them); the body as
    it is. A line of whitespace right after the status line is no fold: it stays an error."""
    out = []
    start = 0
    while (line := data.find(b"\r\n", start)) >= 0:
        fields = line + 2  # the header lines, up to the blank line (or what came of them)
        blank = data.find(b"\r\n\r\n", line)
        fields_end, head_end = (len(data),) * 2 if blank < 0 else (max(blank, fields), blank + 4)
        out += [data[start:fields], _OBS_FOLD.sub(b" ", data[fields:fields_end]),
                data[fields_end:head_end]]
        interim = data[start + 9:start + 10] == b"1"  # HTTP/1.1 1xx: another head follows
        start = head_end
        if not interim:
            break
    return b"".join(out) + data[start:]


#: why a response cut short by a fault is short, as WARC-Truncated says it (a closed
#: connection's: disconnect)
_CUTS = {ExitCode.TOO_LARGE: "length", ExitCode.TIMEOUT: "time"}

#: the parser of a closed connection: it calls nobody back
_DETACHED = httptools.HttpResponseParser(object())


class Connection(asyncio.Protocol):
    """A kept-alive connection to one endpoint, carrying one request at a time."""

    transport: asyncio.Transport

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: Limits, slot: Slot) -> None:
        self._loop = loop
        self.slot = slot  # the pool's permit for this socket, given back when it closes
        self._max_count = limits.max_header_count
        self._max_line = limits.max_header_size
        self._max_head = self._max_count * self._max_line  # memory bound on a head in parts
        self._max_decoded = limits.max_decompressed_size
        self._read_timeout = limits.read_timeout
        self._first_byte = min(limits.first_byte_timeout, limits.total_timeout)
        self._total = limits.total_timeout
        self._min_rate, self._rate_window = limits.min_rate, limits.min_rate_window
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.idle_until = 0.0  # when an idle connection is closed (see pool.py)
        self.requests = 0  # requests sent on this connection
        self.server_keep_alive: float | None = None  # the last response's Keep-Alive timeout
        self._waiter: asyncio.Future[Answer] | None = None
        self._reset(0, False)

    def _reset(self, limit: int, truncate: bool) -> None:
        self._limit = limit
        self._truncate = truncate
        self._headers: dict[str, str] = {}
        self._raw: list[bytes] = []  # the header lines as received, in parts, for `head`
        self._received: list[bytes] = []  # the bytes until the head's end (an obs-fold in it)
        self._reason = b""
        self._parts: list[bytes] = []
        self._decoder: Decoder | None = None
        self.received = 0  # bytes of the response so far (head and body)
        self._body = 0  # body bytes as sent (before decoding)
        self.head_done = False
        self._delimited = False  # the body ends with the message (a length or chunks)
        self.reusable = False  # the response ended cleanly and the server keeps the connection

    # -- the request -------------------------------------------------------------------------
    def request(self, data: bytes, limit: int, truncate: bool, started: float
                ) -> asyncio.Future[Answer]:
        """Send a request; the future gets the response, or the FetchError that ended it.

        The timeouts run from `started` (the loop's time when the fetch began, before any
        connect): the first byte until the response head is in, then the total; and read-idle.
        One timer watches all three: asyncio.timeout changed its timer three times a request.
        """
        self._reset(limit, truncate)
        self.requests += 1
        self._started = started
        waiter = self._waiter = self._loop.create_future()
        self._last_data = self._loop.time()
        self._first_data = self._rate_check = float("inf")  # set by the first byte
        if self._min_rate:  # the rate is checked a window after the first byte; until it comes,
            # the timer comes back every window anyway, so that the first byte need not move it
            self._rate_check = self._last_data + self._rate_window
        self._timer = self._loop.call_at(self._due(), self._on_timer)
        self.transport.write(data)
        return waiter

    def _deadline(self) -> float:
        return self._started + (self._total if self.head_done else self._first_byte)

    def _due(self) -> float:
        """When a timeout could next be reached (data arriving only moves the read-idle one)."""
        return min(self._deadline(), self._last_data + self._read_timeout, self._rate_check)

    def _on_timer(self) -> None:
        now = self._loop.time()
        if now >= self._deadline():
            self._fail(deadline_error(self._first_byte, self._total, self.head_done))
        elif now - self._last_data >= self._read_timeout:
            self._fail(FetchError(ExitCode.TIMEOUT,
                                  f"read-idle timeout ({self._read_timeout}s without data)"))
        elif now >= self._rate_check and self.received < self._min_rate * (now - self._first_data):
            self._fail(FetchError(ExitCode.TIMEOUT, (
                f"too slow: {self.received} bytes in {now - self._first_data:.0f}s "
                f"(under limits.min_rate, {self._min_rate} bytes a second)")))
        else:
            if now >= self._rate_check:
                self._rate_check = now + self._rate_window
            self._timer = self._loop.call_at(self._due(), self._on_timer)

    def _fail(self, error: FetchError | LocalError) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self.head_done and isinstance(error, FetchError):
                self._cut(error)
            waiter.set_exception(error)
        self._finish()
        self.close()

    def _cut(self, error: FetchError) -> None:
        """The head came, then the fault: the error carries the response so far (its status for
        robots.txt's rules, the rest for the WARC files) and why it is short."""
        error.status = error.status or self._parser.get_status_code()
        error.partial = (b"", self.head(), b"".join(self._parts))
        error.cut = _CUTS.get(error.exit_code, "disconnect" if self.closed else "unspecified")

    def _finish(self) -> None:
        self._timer.cancel()
        self._waiter = None

    def close(self) -> None:
        """Close the connection (at once: a response not read to its end is abandoned)."""
        if not self.closed:
            self.closed = True
            self.transport.abort()

    # -- asyncio's callbacks -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.slot.owned = True  # from now on connection_lost gives it back

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes nobody asked for: the connection is not HTTP any more
            self.close()
            return
        self._last_data = self._loop.time()
        if not self.received and self._min_rate:  # the transfer rate is watched from here on
            self._first_data = self._last_data  # (the timer is due before the first check)
            self._rate_check = self._last_data + self._rate_window
        self.received += len(data)
        if not self.head_done and self.received > self._max_head:
            self._fail(FetchError(ExitCode.TOO_LARGE, f"response head over {self._max_head} "
                                  "bytes (the limits on headers: count × line size)"))
            return
        if not self.head_done:
            self._received.append(data)
        error = self._feed(data)
        if error is not None and not self.head_done:  # an obs-fold in the head, perhaps
            received = b"".join(self._received)
            unfolded = unfold(received)
            if unfolded != received:  # parsed again from the start, by a new parser
                self._parser = httptools.HttpResponseParser(self)
                self._headers, self._raw = {}, []
                error = self._feed(unfolded)
        if error is not None:
            self._fail(error)

    def _feed(self, data: bytes) -> FetchError | None:
        """Parse these bytes; the error that ends the request, if they have one."""
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            return cause if isinstance(cause, FetchError) else FetchError(
                ExitCode.PROTOCOL_ERROR, f"bad response: {cause}")
        except httptools.HttpParserError as exc:  # also after a response: not reusable then
            where = "body" if self.head_done else "status line or headers"
            return FetchError(ExitCode.PROTOCOL_ERROR, f"bad response {where}: {exc}")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.slot.release()
        try:
            self._lost(exc)
        finally:
            # the parser calls back our bound methods: a cycle that only the garbage collector
            # would free, with the transport, the timer and the response's parts (a broad crawl
            # opens a connection a request: most of the collector's work, bench/RESULTS.md)
            self._parser = _DETACHED

    def _lost(self, exc: Exception | None) -> None:
        if self._waiter is None:
            return
        if self.head_done and not self._delimited and exc is None:
            # the body ran to the end of the connection (HTTP/1.0 style)
            cut = self._cut_short()
            if cut is None:
                self._complete()
            else:
                self._fail(cut)
            return
        if is_local(exc):  # e.g. ENOBUFS while sending: our machine's fault, not the server's
            self._fail(LocalError(f"{exc}"))
            return
        if self.received == 0:
            detail = "server disconnected before responding"
        elif not self.head_done:
            detail = "server disconnected in the response head"
        else:
            detail = (f"response body not completed: connection closed after {self._body} "
                      "bytes")
        stale = self.received == 0 and self.requests > 1  # a kept-alive one closed meanwhile
        self._fail(FetchError(ExitCode.PROTOCOL_ERROR, detail + (f" ({exc})" if exc else ""),
                              stale=stale))

    # -- httptools' callbacks (a FetchError raised here ends the request) -------------------
    def on_message_begin(self) -> None:
        if self._waiter is None:  # a second response to one request: the connection is out of
            self.close()  # step (its rest would be taken for the next request's answer)

    def on_status(self, reason: bytes) -> None:
        self._reason = reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._waiter is None:
            return  # past the end of the response (a cut-off, or bytes after it)
        headers = self._headers
        if len(headers) >= self._max_count or len(name) + len(value) > self._max_line:
            raise FetchError(ExitCode.TOO_LARGE, f"response head over the limits "
                             f"({self._max_count} headers, {self._max_line} bytes a line)")
        self._raw.extend((name, b": ", value, b"\r\n"))  # joined by head() (no % formatting)
        key = name.decode("latin-1").lower()
        text = value.decode("utf-8", "replace").strip()
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        if self._waiter is None:
            return
        status = self._parser.get_status_code()
        if status < 200:  # 1xx: an interim response; the real one follows
            self._headers = {}
            self._raw = []
            return
        self.head_done = True  # the deadline is now the total (the timer reads it when due)
        self._received = []
        headers = self._headers
        if not self._truncate and media_type(headers.get("content-type")) in _SITEMAP_SIZED:
            self._limit = max(self._limit, self._max_decoded)  # a sitemap's, perhaps
        declared = headers.get("content-length")
        self._delimited = declared is not None or "chunked" in headers.get(
            "transfer-encoding", "").lower() or status in (204, 304)
        if declared is not None and int(declared) > self._limit and not self._truncate:
            raise FetchError(ExitCode.TOO_LARGE,
                             f"Content-Length {declared} over {self._limit} bytes")
        keep_alive = headers.get("keep-alive")
        self.server_keep_alive = None if keep_alive is None else keep_alive_timeout(keep_alive)
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity"):  # with truncate, the decoded body is cut there too
            self._decoder = (Decoder(encoding, self._limit, truncate=True) if self._truncate
                             else Decoder(encoding, self._max_decoded))

    def on_body(self, data: bytes) -> None:
        if self._waiter is None:
            return  # cut off (truncate): the rest is not read
        self._body += len(data)
        over = self._body - self._limit
        if over > 0:
            if not self._truncate:
                raise FetchError(ExitCode.TOO_LARGE, f"body over {self._limit} bytes (cut off)")
            data = data[: len(data) - over]
        decoder = self._decoder
        self._parts.append(data if decoder is None else decoder.feed(data))
        if self._truncate and (over >= 0 or (decoder is not None and decoder.size >= self._limit)):
            self._complete()

    def on_message_complete(self) -> None:
        if self._waiter is None or not self.head_done:
            return  # after a cut-off, or the end of a 1xx response
        cut = self._cut_short()
        if cut is not None:  # what the server sent past the length is not read as a response
            raise cut
        self.reusable = self._parser.should_keep_alive()
        self._complete()

    def _cut_short(self) -> FetchError | None:
        """The error of a body that ended inside its compressed stream: the stream decodes
        without error as far as it goes, and the page would be kept as if whole."""
        if self._decoder is None or not self._decoder.cut_short:
            return None
        return FetchError(ExitCode.PROTOCOL_ERROR, f"compressed body cut short: the message "
                          f"ended after {self._body} bytes, inside its compressed stream")

    def head(self) -> bytes:
        """The response's status line and header lines as received, in their order and case (a
        value as llhttp reads it: without the whitespace before it), and the blank line."""
        parser = self._parser
        status = b"HTTP/%s %d %s\r\n" % (parser.get_http_version().encode(),
                                          parser.get_status_code(), self._reason)
        return status + b"".join(self._raw) + b"\r\n"

    def _complete(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            body = b"".join(self._parts)
            self._parts = []  # not kept by an idle connection beside the body (up to 50 MiB)
            waiter.set_result((self._parser.get_status_code(), self._headers, body, self.head()))
        self._finish()
