"""The HTTP client: a bounded pool of kept-alive connections, no redirect following, bounded
time and size, an address guard on what it connects to, and errors of courtly's own machine
(out of file descriptors, buffers, memory) waited out instead of blamed on the site."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import itertools
import logging
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Protocol

from courtly.config import CrawlConfig, Limits
from courtly.connection import Connection, deadline_error, is_local
from courtly.dns import Addresses, DnsCache
from courtly.errors import FetchError, LocalError, one_line
from courtly.model import ExitCode
from courtly.pool import Pool, Slot, connection_limit
from courtly.proxy import (
    Carried,
    Proxies,
    Proxy,
    ProxyFailure,
    absolute_form,
    open_tunnel,
    proxy_socket,
    refused,
)
from courtly.urls import DEFAULT_PORTS, split_authority, split_target

__all__ = ["Addresses", "FetchError", "Fetcher", "FixedResolver", "GuardedResolver", "HttpResponse",
           "LocalError", "Resolver", "SystemResolver", "address_allowed"]

log = logging.getLogger(__name__)

#: idle connections kept per endpoint
_IDLE_PER_ENDPOINT = 2
#: the longest pause between two tries while courtly's own machine is out of resources
_LOCAL_PAUSE_MAX = 1.0
#: an endpoint whose kept-alive connections were closed before an answer this many times gets
#: no more kept-alive requests: a server's idle timeout meets a request now and then, but a
#: server that reads every request on a kept-alive connection and hangs up would otherwise
#: see each one twice at once (it is sent again on a new connection)
_STALE_MAX = 2
_STALE_ENDPOINTS = 10_000  # endpoints counted at most (memory)
#: seconds without a local error after which each new connection lets the pool grow by one
RECOVER_AFTER = 5.0
#: seconds before the next address is tried while a connection attempt is still pending
NEXT_ATTEMPT = 0.25


@dataclass(slots=True)
class HttpResponse:
    """A received HTTP response with its (decoded) body."""

    url: str
    status: int
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    elapsed: float
    request: bytes = b""  # the request head as sent
    head: bytes = b""  # the status line and headers as received (Connection.head)


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
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG)
        except UnicodeError as exc:  # a label empty or over 63 characters ("a..b"): WHATWG
            # accepts the URL, the IDNA codec cannot encode its name; no name, no addresses
            raise socket.gaierror(socket.EAI_NONAME,
                                  f"not a valid host name: {one_line(exc)}") from None
        out: Addresses = []
        for family, _, _, _, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                address = (str(sockaddr[0]), int(family))
                if address not in out:
                    out.append(address)
        return out


class FixedResolver:
    """Names of `limits.dns_hosts` get their address from it; the others the inner's."""

    def __init__(self, hosts: dict[str, str], inner: Resolver) -> None:
        self._hosts = {name: (address, socket.AF_INET6 if ":" in address else socket.AF_INET)
                       for name, address in hosts.items()}
        self._inner = inner

    async def resolve(self, host: str, port: int) -> Addresses:
        """The fixed address, else the inner resolver's answer."""
        fixed = self._hosts.get(host)
        return [fixed] if fixed is not None else await self._inner.resolve(host, port)


class GuardedResolver:
    """Resolves names, then drops addresses the address guard refuses (so DNS cannot rebind).

    The fetcher connects only to the addresses returned here, so the check is on the address
    actually connected to. A seed's own host (allowed_hosts) is let through as it resolves.
    """

    def __init__(self, allowed_hosts: AbstractSet[str], inner: Resolver | None = None) -> None:
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
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"not an http(s) URL scheme: {scheme!r}")
    host, port_text = split_authority(authority.lower())  # credentials are never sent
    host = host[1:-1] if host.startswith("[") else host
    port = int(port_text) if port_text.isdigit() else -1 if port_text else DEFAULT_PORTS[scheme]
    if not host or not 0 < port < 65536:
        raise ValueError(f"no host or a bad port in {authority!r}")
    return _Endpoint(scheme, host, port, authority.rpartition("@")[2].lower())


def _split(url: str) -> tuple[_Endpoint, str]:
    """A URL's endpoint and request target (path and query); FetchError for a URL without."""
    scheme, authority, target = split_target(url)
    if target[:1] != "/":
        target = "/" + target  # "http://host?q": an empty path
    if scheme is None or authority is None:
        raise FetchError(ExitCode.NETWORK_ERROR, f"not an http(s) URL: {url[:200]!r}")
    if not target.isprintable() or " " in target:
        raise FetchError(ExitCode.NETWORK_ERROR, f"URL not sendable in a request: {url[:200]!r}")
    try:
        return _endpoint(scheme, authority), target
    except ValueError as exc:
        raise FetchError(ExitCode.NETWORK_ERROR, one_line(exc)) from None


def _literal(host: str) -> bool:
    """host is an IP address (no brackets): the C parser for IPv4, as strict as ipaddress's
    (four decimal octets, no leading zeros), so that a crawl of many origins, each its own host,
    parses none in Python."""
    if ":" in host:
        return _literal6(host)
    try:
        socket.inet_pton(socket.AF_INET, host)
    except (OSError, ValueError):  # ValueError: a NUL in it
        return False
    return True


@functools.lru_cache(maxsize=1024)
def _literal6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


class Fetcher:
    """Fetches single URLs with limits; redirects are returned, never followed.

    At most `limits.max_connections` sockets are open (pool.py); connections are kept alive per
    endpoint (at most two idle ones, for `limits.keep_alive` seconds or less if the server says
    so) and never carry a second request before the first is answered. A request that a
    kept-alive connection's server closed before any byte of the answer is sent again at once on
    a new connection. An error of courtly's own machine (out of file descriptors, buffers,
    memory) pauses the request and tries again, for up to `limits.local_error_wait` seconds,
    then raises LocalError.
    """

    def __init__(
        self,
        limits: Limits,
        user_agent: str,
        allowed_hosts: AbstractSet[str] = frozenset(),
        proxies: Proxies | None = None,
        ca_bundle: str | None = None,
    ) -> None:
        self.limits = limits
        self.proxies = proxies  # None: every request goes direct (proxy.py)
        self._ca_bundle = ca_bundle  # None: the system's CAs (and SSL_CERT_FILE)
        #: seeds' hosts (urls.bare_host), let through as they resolve; a fleet's set grows
        self._allowed = allowed_hosts
        self._fixed_headers = (f"User-Agent: {user_agent}\r\nAccept: */*\r\n"
                               "Accept-Encoding: gzip, deflate, br\r\n")
        system: Resolver = SystemResolver()
        if limits.dns_hosts:
            system = FixedResolver(limits.dns_hosts, system)
        self._resolver: Resolver = (
            system if limits.allow_private_addresses else GuardedResolver(self._allowed, system))
        #: the resolver's answers by host (dns.py); `dns.address(host)` is where host went
        self.dns = DnsCache(limits.dns_cache_size, limits.dns_ttl, time.monotonic)
        self._tls: ssl.SSLContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._short_of_resources = False  # a local error since the last connection opened
        self._last_local_error = float("-inf")  # the loop's time of the last one
        #: endpoints whose kept-alive connections were closed before an answer, and how often
        self._stale: dict[_Endpoint, int] = {}

    @classmethod
    def for_crawl(cls, config: CrawlConfig, allowed_hosts: AbstractSet[str]) -> Fetcher:
        """The crawl's fetcher: its limits and User-Agent, its proxy (the `proxy` key, or the
        environment's: ValueError for one that cannot be used) and its CA bundle."""
        proxies = Proxies.from_environment(os.environ, config.proxy)
        return cls(config.limits, config.user_agent, allowed_hosts, proxies, config.ca_bundle)

    async def __aenter__(self) -> Fetcher:
        # kept: Python 3.11's get_running_loop() makes a getpid system call (several a request)
        self._loop = asyncio.get_running_loop()
        limits = self.limits
        self.pool: Pool[_Endpoint, Connection] = Pool(
            self._loop, connection_limit(limits.max_connections), limits.keep_alive,
            _IDLE_PER_ENDPOINT)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.pool.close()

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
        keep_alive: bool = True,
    ) -> HttpResponse:
        """GET one URL; raise FetchError for timeouts, size limits and transport failures,
        LocalError when courtly's own machine could not make the request for
        `limits.local_error_wait` seconds.

        With truncate, a body over max_body is cut there instead of refused (robots.txt).
        keep_alive=False closes the connection after the answer: the caller's next request to
        this endpoint comes after `limits.keep_alive`, when an idle connection would be gone.
        """
        assert self._loop is not None, "use 'async with Fetcher'"
        endpoint, target = _split(url)
        self._check_literal_address(endpoint.host)
        request = self._request(endpoint, target, headers)
        proxy = self._proxy(endpoint)
        sent = absolute_form(request, endpoint.scheme, endpoint.host_header, proxy)
        limit = max_body or self.limits.max_body_size
        fresh = False  # True: not on a kept-alive connection
        short_since: float | None = None  # when this request first met a local error
        with carrying(self.proxies, proxy, endpoint.host_header) as carried:
            while True:
                try:
                    # no more kept-alive connections to a server that hangs up on them (_STALE_MAX)
                    keep = keep_alive and self._stale.get(endpoint, 0) < _STALE_MAX
                    response = await self._send(url, endpoint, sent, limit, truncate, fresh, keep)
                    if carried is not None:
                        proxied(response, carried, request)
                    return response
                except FetchError as exc:
                    if not exc.stale:  # (ProxyFailure: the proxy failed once too many)
                        raise watched(carried, exc, request) from None
                    fresh = True  # the server closed it while idle: once more on a new connection
                    if endpoint in self._stale or len(self._stale) < _STALE_ENDPOINTS:
                        self._stale[endpoint] = self._stale.get(endpoint, 0) + 1
                except LocalError as exc:
                    if isinstance(exc, ProxyFailure):
                        raise
                    short_since = await self._pause(exc, short_since)

    async def _send(self, url: str, endpoint: _Endpoint, request: bytes, limit: int,
                    truncate: bool, fresh: bool, keep_alive: bool = True) -> HttpResponse:
        """One try: on a kept-alive connection, or a new one once the pool has room for it."""
        loop = self._loop
        assert loop is not None
        conn = None if fresh else self.pool.take(endpoint)
        try:
            if conn is None:
                slot = await self.pool.slot()  # a wait for our own bound is not the site's time
                started, loop_started = time.monotonic(), loop.time()
                conn = await self._connection(endpoint, slot, loop_started)
            else:
                started, loop_started = time.monotonic(), loop.time()
            status, hdrs, body, head = await conn.request(request, limit, truncate, loop_started)
        except FetchError as exc:
            if exc.exit_code is ExitCode.TIMEOUT:
                raise FetchError(exc.exit_code, f"{exc.detail} {_took(started)}",
                                 status=exc.status, partial=exc.partial, cut=exc.cut) from None
            raise
        finally:
            if conn is not None:
                self._release(endpoint, conn, keep_alive)
        return HttpResponse(url, status, hdrs, body, time.monotonic() - started, request,
                            head)

    async def _pause(self, exc: LocalError, since: float | None) -> float:
        """Wait a moment for courtly's own machine to recover (idle connections closed, the
        pool's bound lowered to what the process could open); raise LocalError after
        `limits.local_error_wait` seconds. Returns when this request first met the error."""
        loop = self._loop
        assert loop is not None
        now = self._last_local_error = loop.time()
        since = now if since is None else since
        self.pool.shrink()
        wait = self.limits.local_error_wait
        if now - since >= wait:
            raise LocalError(f"{exc.detail} for {wait:g}s") from None
        if not self._short_of_resources:
            self._short_of_resources = True
            log.warning("courtly's own machine is short of resources (%s): at most %d "
                        "connections from now on, waiting", exc.detail, self.pool.limit)
        pause = min(_LOCAL_PAUSE_MAX, 0.05 + (now - since) / 2, since + wait - now)
        await asyncio.sleep(pause)
        return since

    def _request(self, endpoint: _Endpoint, target: str, headers: dict[str, str] | None
                 ) -> bytes:
        head = f"GET {target} HTTP/1.1\r\nHost: {endpoint.host_header}\r\n{self._fixed_headers}"
        for name, value in (headers or {}).items():
            if "\r" in value or "\n" in value:  # a stored validator must not add a header
                value = " ".join(value.split())
            head += f"{name}: {value}\r\n"
        return (head + "\r\n").encode("utf-8", "replace")

    # -- connections ---------------------------------------------------------------------------
    async def _connection(self, endpoint: _Endpoint, slot: Slot, started: float) -> Connection:
        """A new connection to the endpoint (connected before the connect timeout, and before
        the first-byte deadline of the fetch that began at `started`), its socket on `slot`."""
        now = self._loop.time()  # type: ignore[union-attr]
        lim = self.limits
        first_byte = min(lim.first_byte_timeout, lim.total_timeout)
        connect_first = now + lim.connect_timeout <= started + first_byte
        try:
            async with asyncio.timeout_at(min(now + lim.connect_timeout, started + first_byte)):
                conn = await self._open(endpoint, slot)
            self._short_of_resources = False
            if self._loop.time() - self._last_local_error > RECOVER_AFTER:  # type: ignore[union-attr]
                self.pool.grow()  # back towards its bound, a connection at a time
            return conn
        except TimeoutError:
            if connect_first:
                raise FetchError(ExitCode.TIMEOUT, f"connect timeout ({lim.connect_timeout}s)"
                                 ) from None
            raise deadline_error(first_byte, lim.total_timeout, False) from None

    async def _open(self, endpoint: _Endpoint, first_slot: Slot) -> Connection:
        """Resolve and connect (happy eyeballs); every socket tried holds a slot of the pool."""
        proxy = self._proxy(endpoint)
        if proxy is not None:
            return await self._open_through(proxy, endpoint, first_slot)
        host = endpoint.host
        try:
            if _literal(host):
                addresses = [(host, 0)]
            else:
                addresses = await self._resolve(host, endpoint.port)
        except BaseException:
            first_slot.release()
            raise
        tls = self._tls_context() if endpoint.scheme == "https" else None
        loop, limits, slots = self._loop, self.limits, [first_slot]

        async def connect(address: str, family: int) -> Connection:
            slot = slots.pop() if slots else await self.pool.slot()
            try:
                _, conn = await loop.create_connection(  # type: ignore[union-attr]
                    lambda: Connection(loop, limits, slot), address,  # type: ignore[arg-type]
                    endpoint.port, family=family, ssl=tls, server_hostname=host if tls else None)
            except BaseException as exc:
                if not slot.owned:  # else the connection gives it back when it closes
                    slot.release()
                if is_local(exc):
                    raise LocalError(f"connect: {one_line(exc)}") from None
                raise
            return conn

        attempts = [functools.partial(connect, a, f) for a, f in interleaved(addresses)]
        try:
            return await first_connection(attempts)
        except ssl.SSLError as exc:  # before OSError: it is one
            raise FetchError(ExitCode.PROTOCOL_ERROR, f"TLS: {one_line(exc)}") from None
        except OSError as exc:
            raise FetchError(ExitCode.NETWORK_ERROR, f"connect: {one_line(exc)}") from None
        finally:
            for slot in slots:  # no attempt was started (no address)
                slot.release()

    def _tls_context(self) -> ssl.SSLContext:
        """The TLS settings of every HTTPS connection (made once)."""
        if self._tls is None:
            self._tls = ssl.create_default_context(cafile=self._ca_bundle)
        return self._tls

    # -- proxies (proxy.py) --------------------------------------------------------------------
    def _proxy(self, endpoint: _Endpoint) -> Proxy | None:
        if self.proxies is None:
            return None
        return self.proxies.for_url(endpoint.scheme, endpoint.host, endpoint.port)

    async def _open_through(self, proxy: Proxy, endpoint: _Endpoint, slot: Slot) -> Connection:
        """A connection to the endpoint through an HTTP proxy: to the proxy itself (http), or a
        tunnel it opens with CONNECT, with TLS to the site over it (https). Target names are
        resolved by the proxy: only an address in the URL meets the address guard."""
        loop, limits = self._loop, self.limits
        assert loop is not None
        sock = None
        try:
            sock = await proxy_socket(loop, proxy)
            tls = None
            if endpoint.scheme == "https":
                await open_tunnel(loop, sock, proxy, _authority(endpoint), limits.max_header_size)
                tls = self._tls_context()
            _, conn = await loop.create_connection(
                lambda: Connection(loop, limits, slot), sock=sock, ssl=tls,
                server_hostname=endpoint.host if tls else None)
            return conn
        except BaseException as exc:
            if not slot.owned:
                slot.release()
                if sock is not None:
                    sock.close()
            if is_local(exc):
                raise LocalError(f"connect: {one_line(exc)}") from None
            if isinstance(exc, ssl.SSLError):
                raise FetchError(ExitCode.PROTOCOL_ERROR, f"TLS: {one_line(exc)}") from None
            if isinstance(exc, OSError):  # the tunnel or its TLS handshake failed
                raise FetchError(ExitCode.PROXY_ERROR, f"{proxy}: {one_line(exc)}") from None
            raise

    async def address_of(self, host: str, port: int) -> str | None:
        """The address a request to host:port would try first (None if it has none): resolved
        through the DNS cache, so the request itself finds it there."""
        host = host.strip("[]").lower()
        if _literal(host):
            return host
        try:
            return (await self._resolve(host, port))[0][0]
        except (FetchError, LocalError):
            return None

    async def _resolve(self, host: str, port: int) -> Addresses:
        """The addresses to connect to: the resolver's answers, through the DNS cache."""
        try:
            return await self.dns.resolve(host, port, self._resolver.resolve)
        except _BlockedAddress as exc:
            raise FetchError(ExitCode.BLOCKED_ADDRESS, str(exc)) from None
        except OSError as exc:
            if is_local(exc):
                raise LocalError(f"resolve: {one_line(exc)}") from None
            raise FetchError(ExitCode.NETWORK_ERROR, f"connect: {one_line(exc)}") from None

    def _release(self, endpoint: _Endpoint, conn: Connection, keep: bool = True) -> None:
        """Keep a connection whose response ended cleanly (if asked to); close any other."""
        if keep and conn.reusable and not conn.closed:
            self.pool.put(endpoint, conn)
        else:
            conn.close()


def carrying(proxies: Proxies | None, proxy: Proxy | None, site: str
             ) -> contextlib.AbstractContextManager[Carried | None]:
    """A request for the site, under way through its proxy while in this block (None: direct)."""
    if proxies is None or proxy is None:
        return contextlib.nullcontext(None)
    return proxies.watch.carrying(proxy, site)


def proxied(response: HttpResponse, carried: Carried, request: bytes) -> None:
    """A response that came through a proxy: the proxy's refusal (407), or its 502s for every
    site (proxy.ProxyWatch), is a ProxyFailure; the request kept with it is the one for the site
    (no absolute form, no proxy credentials)."""
    if response.status == 407:
        raise refused(carried.proxy)
    carried.watch.answered(carried, response.status)
    response.request = request


def watched(carried: Carried | None, exc: FetchError, request: bytes) -> FetchError:
    """A request's failure, once the proxy that carried it is told (ProxyFailure: it failed
    every site too many times); the response it cut short keeps the request for the site, as
    `proxied` keeps it with a response."""
    if carried is not None:
        carried.watch.failed(carried, exc)
    if exc.partial is not None:
        exc.partial = (request, *exc.partial[1:])
    return exc


def _authority(endpoint: _Endpoint) -> str:
    host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
    return f"{host}:{endpoint.port}"


def _took(started: float) -> str:
    return f"after {time.monotonic() - started:.1f}s"


def interleaved(addresses: Addresses) -> Addresses:
    """The resolver's order, families alternating from the first answer's (RFC 8305 4)."""
    if len(addresses) < 2:
        return addresses
    first = [a for a in addresses if a[1] == addresses[0][1]] if addresses else []
    other = [a for a in addresses if a not in first]
    return [a for pair in itertools.zip_longest(first, other) for a in pair if a is not None]


async def first_connection(attempts: Sequence[Callable[[], Awaitable[Connection]]]
                           ) -> Connection:
    """Happy eyeballs (RFC 8305): the next attempt starts when the last fails or after
    NEXT_ATTEMPT seconds, the first to connect wins, the others are cancelled or closed.

    By hand: asyncio races the addresses only when it resolves the name itself, and courtly
    resolves it first, to refuse non-public addresses. Raises the last attempt's error. One
    address (an IP literal, most names) is awaited in the caller's task: no race to run.
    """
    if len(attempts) == 1:
        return await attempts[0]()
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
                if isinstance(error, ssl.SSLError | LocalError):  # no other address helps
                    raise error
    finally:
        for task in running:
            if task.done() and not task.cancelled() and task.exception() is None:
                task.result().close()
            else:
                task.cancel()

