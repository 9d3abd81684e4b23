"""The HTTP client: kept-alive connections per endpoint, no redirect following, bounded time
and size, and an address guard on what it connects to."""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import itertools
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from courtly.config import Limits
from courtly.connection import Connection, FetchError, deadline_error
from courtly.model import ExitCode

__all__ = ["Addresses", "FetchError", "Fetcher", "GuardedResolver", "Resolver", "Response",
           "SystemResolver", "address_allowed", "one_line"]

#: an idle connection is closed after this many seconds (servers close theirs after 5-75)
KEEP_ALIVE = 15.0
#: idle connections kept per endpoint
_IDLE_PER_ENDPOINT = 2
_DNS_TTL = 300.0
#: seconds before the next address is tried while a connection attempt is still pending
NEXT_ATTEMPT = 0.25
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(slots=True)
class Response:
    """A received HTTP response with its (decoded) body."""

    url: str
    status: int
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    elapsed: float


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


#: a resolver's answer: the (address, address family) pairs to connect to, in order
Addresses = list[tuple[str, int]]


class Resolver(Protocol):
    """Turns a host name into the addresses to connect to."""

    async def resolve(self, host: str, port: int) -> Addresses:
        """The addresses of host (OSError if it has none)."""
        ...


class SystemResolver:
    """The system's resolver: getaddrinfo in asyncio's thread pool (what aiohttp's
    ThreadedResolver does; by hand, as importing aiohttp cost each crawl 0.2 s of CPU)."""

    async def resolve(self, host: str, port: int) -> Addresses:
        """Each address once, in the order the system gives them."""
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG)
        out: Addresses = []
        for family, _, _, _, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                address = (str(sockaddr[0]), int(family))
                if address not in out:
                    out.append(address)
        return out


class GuardedResolver:
    """Resolves names, then drops addresses the address guard refuses (so DNS cannot rebind).

    The fetcher connects only to the addresses returned here, so the check is on the address
    actually connected to. A seed's own host (allowed_hosts) is let through as it resolves.
    """

    def __init__(self, allowed_hosts: frozenset[str], inner: Resolver | None = None) -> None:
        self._inner = inner or SystemResolver()
        self._allowed = allowed_hosts

    async def resolve(self, host: str, port: int) -> Addresses:
        """Resolve and filter."""
        results = await self._inner.resolve(host, port)
        if host in self._allowed:
            return results
        # by host, not by address: another name for a seed's address is not the seed's host
        kept = [r for r in results if address_allowed(r[0])]
        if not kept:
            raise _BlockedAddress(f"{host} resolves only to non-public addresses")
        return kept


class _BlockedAddress(OSError):
    pass


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """Where a URL's request goes: what is connected to, and the Host header."""

    scheme: str
    host: str  # lower case, IPv6 without brackets: as resolved and connected to
    port: int
    host_header: str


@functools.lru_cache(maxsize=4096)
def _endpoint(scheme: str, authority: str) -> _Endpoint:
    """The endpoint of "scheme://authority" (ValueError if it names none)."""
    if scheme not in _DEFAULT_PORTS:
        raise ValueError(f"not an http(s) URL scheme: {scheme!r}")
    hostport = authority.rpartition("@")[2].lower()  # credentials are never sent
    if hostport.startswith("["):
        end = hostport.find("]")
        host, port_text = hostport[1:end], hostport[end + 1:].removeprefix(":")
    else:
        host, _, port_text = hostport.partition(":")
    port = int(port_text) if port_text else _DEFAULT_PORTS[scheme]
    if not host or not 0 < port < 65536:
        raise ValueError(f"no host or a bad port in {authority!r}")
    return _Endpoint(scheme, host, port, hostport)


def _split(url: str) -> tuple[_Endpoint, str]:
    """A URL's endpoint and request target (path and query); FetchError for a URL without."""
    scheme, _, rest = url.partition("://")
    slash = rest.find("/")
    authority, target = (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
    if "?" in authority or "#" in authority:  # "http://host?q": an empty path
        authority, _, query = authority.partition("#")[0].partition("?")
        target = "/?" + query if query else "/"
    target = target.partition("#")[0]
    if not target.isprintable() or " " in target:
        raise FetchError(ExitCode.NETWORK_ERROR, f"URL not sendable in a request: {url[:200]!r}")
    try:
        return _endpoint(scheme, authority), target
    except ValueError as exc:
        raise FetchError(ExitCode.NETWORK_ERROR, one_line(exc)) from None


@functools.lru_cache(maxsize=1024)
def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Fetcher:
    """Fetches single URLs with limits; redirects are returned, never followed.

    Connections are kept alive per endpoint (at most two idle ones, closed after KEEP_ALIVE
    seconds idle) and never carry a second request before the first is answered. A request is
    sent once: a kept connection the server closed at that moment is a PROTOCOL_ERROR, retried
    as a crawl action, never resent silently.
    """

    def __init__(
        self,
        limits: Limits,
        user_agent: str,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self.limits = limits
        # as URLs spell hosts to the resolver: no IPv6 brackets, lower case
        self._allowed = frozenset(h.strip("[]").lower() for h in allowed_hosts)
        self._fixed_headers = (f"User-Agent: {user_agent}\r\nAccept: */*\r\n"
                               "Accept-Encoding: gzip, deflate, br\r\n")
        self._resolver: Resolver = (
            SystemResolver() if limits.allow_private_addresses
            else GuardedResolver(self._allowed))
        self._idle: dict[_Endpoint, list[Connection]] = {}
        self._dns: dict[str, tuple[float, Addresses]] = {}
        self._tls: ssl.SSLContext | None = None
        self._sweep_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> Fetcher:
        # kept: Python 3.11's get_running_loop() makes a getpid system call (several a request)
        self._loop = asyncio.get_running_loop()
        self._protocol = functools.partial(Connection, self._loop, self.limits)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()

    def _check_literal_address(self, host: str) -> None:
        host = host.strip("[]").lower()
        if self.limits.allow_private_addresses or host in self._allowed or not _literal(host):
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
        assert self._loop is not None, "use 'async with Fetcher'"
        lim = self.limits
        started = time.monotonic()
        loop_started = self._loop.time()  # the timeouts run from here, connecting included
        conn = None
        endpoint, target = _split(url)
        self._check_literal_address(endpoint.host)
        request = self._request(endpoint, target, headers)
        try:
            conn = await self._connection(endpoint, loop_started)
            status, hdrs, body = await conn.request(
                request, max_body or lim.max_body_size, truncate, loop_started)
        except FetchError as exc:
            if exc.exit_code is ExitCode.TIMEOUT:
                raise FetchError(exc.exit_code, f"{exc.detail} {_took(started)}") from None
            raise
        finally:
            if conn is not None:
                self._release(endpoint, conn)
        return Response(url, status, hdrs, body, time.monotonic() - started)

    def _request(self, endpoint: _Endpoint, target: str, headers: dict[str, str] | None
                 ) -> bytes:
        head = f"GET {target} HTTP/1.1\r\nHost: {endpoint.host_header}\r\n{self._fixed_headers}"
        for name, value in (headers or {}).items():
            if "\r" in value or "\n" in value:  # a stored validator must not add a header
                value = " ".join(value.split())
            head += f"{name}: {value}\r\n"
        return (head + "\r\n").encode("utf-8", "replace")

    # -- connections ---------------------------------------------------------------------------
    async def _connection(self, endpoint: _Endpoint, started: float) -> Connection:
        """A kept-alive connection to the endpoint, or a new one (connected before the connect
        timeout, and before the first-byte deadline of the fetch that began at `started`)."""
        idle = self._idle.get(endpoint)
        now = self._loop.time()  # type: ignore[union-attr]
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < KEEP_ALIVE:
                return conn
            conn.close()
        lim = self.limits
        first_byte = min(lim.first_byte_timeout, lim.total_timeout)
        connect_first = now + lim.connect_timeout <= started + first_byte
        try:
            async with asyncio.timeout_at(min(now + lim.connect_timeout, started + first_byte)):
                return await self._open(endpoint)
        except TimeoutError:
            if connect_first:
                raise FetchError(ExitCode.TIMEOUT, f"connect timeout ({lim.connect_timeout}s)"
                                 ) from None
            raise deadline_error(first_byte, lim.total_timeout, False) from None

    async def _open(self, endpoint: _Endpoint) -> Connection:
        host = endpoint.host
        if _literal(host):
            addresses = [(host, 0)]
        else:
            addresses = await self._resolve(host, endpoint.port)
        tls = None
        if endpoint.scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()

        async def connect(address: str, family: int) -> Connection:
            _, conn = await self._loop.create_connection(  # type: ignore[union-attr]
                self._protocol, address, endpoint.port, family=family, ssl=tls,
                server_hostname=host if tls else None)
            return conn

        attempts = [functools.partial(connect, a, f) for a, f in interleaved(addresses)]
        try:
            return await first_connection(attempts)
        except ssl.SSLError as exc:  # before OSError: it is one
            raise FetchError(ExitCode.PROTOCOL_ERROR, f"TLS: {one_line(exc)}") from None
        except OSError as exc:
            raise FetchError(ExitCode.NETWORK_ERROR, f"connect: {one_line(exc)}") from None

    async def _resolve(self, host: str, port: int) -> Addresses:
        """The addresses to connect to (the resolver's answers, kept for _DNS_TTL seconds)."""
        now = self._loop.time()  # type: ignore[union-attr]
        known = self._dns.get(host)
        if known is not None and known[0] > now:
            return known[1]
        try:
            addresses = await self._resolver.resolve(host, port)
        except _BlockedAddress as exc:
            raise FetchError(ExitCode.BLOCKED_ADDRESS, str(exc)) from None
        except OSError as exc:
            raise FetchError(ExitCode.NETWORK_ERROR, f"connect: {one_line(exc)}") from None
        self._dns[host] = (now + _DNS_TTL, addresses)
        return addresses

    def _release(self, endpoint: _Endpoint, conn: Connection) -> None:
        """Keep a connection whose response ended cleanly; close any other."""
        now = self._loop.time()  # type: ignore[union-attr]
        idle = self._idle.setdefault(endpoint, [])
        if conn.reusable and not conn.closed and len(idle) < _IDLE_PER_ENDPOINT:
            conn.idle_since = now
            idle.append(conn)
        else:
            conn.close()
        if now >= self._sweep_at:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Close connections idle too long; forget expired DNS answers."""
        self._sweep_at = now + KEEP_ALIVE
        for endpoint, idle in list(self._idle.items()):
            kept = []
            for conn in idle:
                if conn.closed or now - conn.idle_since >= KEEP_ALIVE:
                    conn.close()
                else:
                    kept.append(conn)
            if kept:
                self._idle[endpoint] = kept
            else:
                del self._idle[endpoint]
        self._dns = {h: v for h, v in self._dns.items() if v[0] > now}


def _took(started: float) -> str:
    return f"after {time.monotonic() - started:.1f}s"


def interleaved(addresses: Addresses) -> Addresses:
    """The resolver's order, families alternating from the first answer's (RFC 8305 4)."""
    first = [a for a in addresses if a[1] == addresses[0][1]] if addresses else []
    other = [a for a in addresses if a not in first]
    return [a for pair in itertools.zip_longest(first, other) for a in pair if a is not None]


async def first_connection(attempts: Iterable[Callable[[], Awaitable[Connection]]]) -> Connection:
    """Happy eyeballs (RFC 8305): the next attempt starts when the last fails or after
    NEXT_ATTEMPT seconds, the first to connect wins, the others are cancelled or closed.

    By hand: asyncio races the addresses only when it resolves the name itself, and courtly
    resolves it first, to refuse non-public addresses. Raises the last attempt's error.
    """
    waiting = iter(attempts)
    running: set[asyncio.Task[Connection]] = set()
    error: BaseException = OSError("no address")
    try:
        while True:
            attempt = next(waiting, None)
            if attempt is not None:
                running.add(asyncio.ensure_future(attempt()))
            elif not running:
                raise error
            done, running = await asyncio.wait(
                running, timeout=NEXT_ATTEMPT if attempt is not None else None,
                return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is None:
                    running |= done - {task}  # closed below if they connected too
                    return task.result()
                error = task.exception() or error
                if isinstance(error, ssl.SSLError):
                    raise error
    finally:
        for task in running:
            if task.done() and not task.cancelled() and task.exception() is None:
                task.result().close()
            else:
                task.cancel()


def one_line(exc: BaseException | str) -> str:
    """An exception or a message as one line of valid text (at most 300 characters)."""
    text = exc if isinstance(exc, str) else str(exc) or type(exc).__name__
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return " ".join(text.split())[:300]
