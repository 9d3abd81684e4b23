"""The HTTP client: one pooled aiohttp session, no redirect following, bounded time and size."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import ssl
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import brotli
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from courtly.config import Limits
from courtly.model import ExitCode

_CHUNK = 16 * 1024
#: aiohttp's messages when a response head is over max_header_count / max_header_size
_HEADER_LIMIT = re.compile(r"Too many headers|Got more than \d+ bytes|Header value too long|"
                           r"Status line is too long|Request line too long", re.I)


@dataclass(slots=True)
class Response:
    """A received HTTP response with its (decoded) body."""

    url: str
    status: int
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    elapsed: float


class FetchError(Exception):
    """A fetch that ended without a usable response, with the exit code to log."""

    def __init__(self, exit_code: ExitCode, detail: str) -> None:
        super().__init__(detail)
        self.exit_code = exit_code
        self.detail = detail


def address_allowed(address: str, allowed_hosts: Iterable[str] = ()) -> bool:
    """True for a public unicast address, or one the user allowed explicitly (a seed's own host)."""
    if address in allowed_hosts:
        return True
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is not None:
            ip = embedded
    return ip.is_global and not (
        ip.is_multicast or ip.is_reserved or ip.is_loopback or ip.is_link_local
        or ip.is_private or ip.is_unspecified
    )


class GuardedResolver(AbstractResolver):
    """Resolves names, then drops addresses the address guard refuses (so DNS cannot rebind).

    aiohttp connects only to the addresses returned here, so the check is on the address
    actually connected to. A seed's own host (allowed_hosts) is let through as it resolves.
    """

    def __init__(
        self, allowed_hosts: frozenset[str], inner: AbstractResolver | None = None
    ) -> None:
        self._inner = inner or DefaultResolver()
        self._allowed = allowed_hosts

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """Resolve and filter."""
        results = await self._inner.resolve(host, port, family)
        if host in self._allowed:
            return results
        # by host, not by address: another name for a seed's address is not the seed's host
        kept = [r for r in results if address_allowed(r["host"])]
        if not kept:
            raise _BlockedAddress(f"{host} resolves only to non-public addresses")
        return kept

    async def close(self) -> None:
        """Close the inner resolver."""
        await self._inner.close()


class _BlockedAddress(OSError):
    pass


class _Decoder:
    """Content-Encoding decoder with a cap on the decoded size (a bomb is cut off, not inflated)."""

    def __init__(self, encoding: str, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self._zlib: Any = None
        self._brotli: Any = None
        if encoding in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._zlib = zlib.decompressobj(wbits=zlib.MAX_WBITS)  # zlib; raw deflate on retry
            self._raw_fallback = True
        elif encoding == "br":
            self._brotli = brotli.Decompressor()
        elif encoding not in ("", "identity"):
            raise FetchError(ExitCode.PROTOCOL_ERROR, f"unsupported Content-Encoding: {encoding}")

    def feed(self, data: bytes) -> bytes:
        """Decode one chunk; raise TOO_LARGE past the limit, PROTOCOL_ERROR on garbage."""
        try:
            if self._zlib is not None:
                out = self._inflate(data)
            elif self._brotli is not None:
                out = self._brotli.process(data, output_buffer_limit=self.limit - self.size + 1)
            else:
                out = data
            assert isinstance(out, bytes)
        except (zlib.error, brotli.error) as exc:
            raise FetchError(ExitCode.PROTOCOL_ERROR, f"bad compressed body: {exc}") from None
        self._count(len(out))
        return out

    def _count(self, n: int) -> None:
        self.size += n
        if self.size > self.limit:
            raise FetchError(
                ExitCode.TOO_LARGE, f"decompressed body over {self.limit} bytes (cut off)"
            )

    def _inflate(self, data: bytes) -> bytes:
        out: list[bytes] = []
        produced = 0
        while data:
            room = self.limit - self.size - produced + 1
            try:
                chunk = self._zlib.decompress(data, room)
            except zlib.error:
                if self.size or produced or not getattr(self, "_raw_fallback", False):
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


class Fetcher:
    """Fetches single URLs with limits; redirects are returned, never followed."""

    def __init__(
        self,
        limits: Limits,
        user_agent: str,
        concurrency: int,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self.limits = limits
        self.user_agent = user_agent
        # as URLs spell hosts to the resolver: no IPv6 brackets, lower case
        self._allowed = frozenset(h.strip("[]").lower() for h in allowed_hosts)
        self._concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> Fetcher:
        # kept: Python 3.11's get_running_loop() makes a getpid system call (several a request)
        self._loop = asyncio.get_running_loop()
        resolver = None if self.limits.allow_private_addresses else GuardedResolver(self._allowed)
        connector = aiohttp.TCPConnector(
            limit=self._concurrency * 2,
            limit_per_host=2,
            ttl_dns_cache=300,
            resolver=resolver,
            enable_cleanup_closed=True,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers={"User-Agent": self.user_agent, "Accept-Encoding": "gzip, deflate, br"},
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            max_field_size=self.limits.max_header_size,
            max_line_size=self.limits.max_header_size,
            max_headers=self.limits.max_header_count,
            timeout=aiohttp.ClientTimeout(
                total=None,
                connect=self.limits.connect_timeout,
                sock_read=self.limits.read_timeout,
            ),
        )
        # one request per crawl action: no silent resend when a server drops the connection
        if hasattr(self._session, "_retry_connection"):
            self._session._retry_connection = False
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    def _check_literal_address(self, host: str) -> None:
        host = host.strip("[]").lower()
        if self.limits.allow_private_addresses or host in self._allowed:
            return
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return  # a name: the resolver guards it
        if not address_allowed(host):
            raise FetchError(ExitCode.BLOCKED_ADDRESS, f"address {host} is not public")

    async def get(
        self,
        url: str,
        headers: dict[str, str] | None = None,
        max_body: int | None = None,
        truncate: bool = False,
    ) -> Response:
        """GET one URL; raise FetchError for timeouts, size limits and transport failures.

        With truncate, a body over max_body is cut there instead of refused (robots.txt).
        """
        assert self._session is not None and self._loop is not None, "use 'async with Fetcher'"
        lim = self.limits
        limit = max_body or lim.max_body_size
        started = time.monotonic()
        # one deadline: the first-byte timeout until the response head is in, then the total
        loop_started = self._loop.time()
        deadline = asyncio.timeout_at(loop_started + min(lim.first_byte_timeout, lim.total_timeout))
        head = False
        try:
            async with deadline:
                target = URL(url, encoded=True)  # normalized: percent-encoded already
                self._check_literal_address(target.raw_host or "")
                resp = await self._session.get(target, headers=headers, allow_redirects=False)
                head = True
                deadline.reschedule(loop_started + lim.total_timeout)
                async with resp:
                    return await self._read(resp, url, limit, truncate, started)
        except FetchError:
            raise
        except TimeoutError as exc:
            raise FetchError(ExitCode.TIMEOUT, self._timeout_detail(exc, deadline, head,
                                                                    started)) from None
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, _BlockedAddress):
                raise FetchError(ExitCode.BLOCKED_ADDRESS, str(exc.os_error)) from None
            if isinstance(exc, aiohttp.ClientSSLError):
                raise FetchError(ExitCode.PROTOCOL_ERROR, f"TLS: {exc}") from None
            raise FetchError(ExitCode.NETWORK_ERROR, f"connect: {exc.os_error}") from None
        except _BlockedAddress as exc:
            raise FetchError(ExitCode.BLOCKED_ADDRESS, str(exc)) from None
        except aiohttp.ClientResponseError as exc:
            if _HEADER_LIMIT.search(exc.message):
                raise FetchError(ExitCode.TOO_LARGE, f"response head over the limits "
                                 f"({lim.max_header_count} headers, {lim.max_header_size} "
                                 f"bytes a line): {one_line(exc.message)}") from None
            raise FetchError(ExitCode.PROTOCOL_ERROR, one_line(exc.message)) from None
        except aiohttp.ClientPayloadError as exc:
            raise FetchError(ExitCode.PROTOCOL_ERROR, one_line(exc)) from None
        except aiohttp.ServerDisconnectedError as exc:
            raise FetchError(ExitCode.PROTOCOL_ERROR, one_line(exc)) from None
        except (aiohttp.ClientError, ssl.SSLError, OSError, ValueError, UnicodeError) as exc:
            raise FetchError(ExitCode.NETWORK_ERROR, one_line(exc)) from None

    async def _read(
        self, resp: aiohttp.ClientResponse, url: str, limit: int, truncate: bool, started: float
    ) -> Response:
        """Read the body chunk by chunk, cutting it off at the size limits."""
        declared = resp.content_length
        if declared is not None and declared > limit and not truncate:
            raise FetchError(ExitCode.TOO_LARGE, f"Content-Length {declared} over {limit} bytes")
        decoder = _Decoder(
            resp.headers.get("Content-Encoding", "").strip().lower(),
            self.limits.max_decompressed_size,
        )
        parts: list[bytes] = []
        received = 0
        async for chunk in resp.content.iter_chunked(_CHUNK):
            received += len(chunk)
            if received > limit:
                if not truncate:
                    raise FetchError(ExitCode.TOO_LARGE, f"body over {limit} bytes (cut off)")
                parts.append(decoder.feed(chunk[: len(chunk) - (received - limit)]))
                break
            parts.append(decoder.feed(chunk))
        hdrs: dict[str, str] = {}
        for name, value in resp.headers.items():
            key = name.lower()
            if not value.isascii():  # bytes that are not UTF-8 arrive as surrogates: replaced
                value = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            hdrs[key] = f"{hdrs[key]}, {value}" if key in hdrs else value
        return Response(url, resp.status, hdrs, b"".join(parts), time.monotonic() - started)

    def _timeout_detail(
        self, exc: BaseException, deadline: asyncio.Timeout, head: bool, started: float
    ) -> str:
        lim = self.limits
        took = f"after {time.monotonic() - started:.1f}s"
        first_byte = lim.first_byte_timeout < lim.total_timeout and not head
        if deadline.expired() and not first_byte:
            return f"total timeout ({lim.total_timeout}s) {took}"
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return f"connect timeout ({lim.connect_timeout}s) {took}"
        if deadline.expired():
            return f"first-byte timeout ({lim.first_byte_timeout}s) {took}"
        if isinstance(exc, aiohttp.SocketTimeoutError):
            return f"read-idle timeout ({lim.read_timeout}s without data) {took}"
        return f"timed out {took}"


def one_line(exc: BaseException | str) -> str:
    """An exception or a message as one line of valid text (at most 300 characters)."""
    text = exc if isinstance(exc, str) else str(exc) or type(exc).__name__
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return " ".join(text.split())[:300]
