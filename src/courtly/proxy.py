"""Which HTTP proxy a request goes through, read the way curl and requests read it.

The `proxy` config key (one proxy for http and https URLs) or the environment: `http_proxy` for
http URLs, `https_proxy` for https URLs, `all_proxy` for both when those are unset; each in lower
case or else upper case (`HTTP_PROXY`, …). `no_proxy` / `NO_PROXY` lists the hosts reached
directly: `*` (all), a name (itself and its subdomains; a leading `.` or `*.` is the same), a name
or address with `:port` (that port only), an address, or a network (`10.0.0.0/8`). A proxy URL is
`http://[user:password@]host[:port]` (no scheme: http; no port: 80); the user and password,
percent-decoded, are sent as `Proxy-Authorization: Basic`.

Plain HTTP goes to the proxy with the URL as the request target (absolute form); HTTPS goes
through a tunnel the proxy opens with CONNECT, and TLS is then made with the site itself.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from courtly.errors import FetchError, LocalError, one_line
from courtly.model import ExitCode


class ProxyFailure(LocalError):
    """The proxy cannot be reached or will not carry any request (407): the crawl stops with
    one line, as for courtly's own machine (no site is to blame, none loses patience)."""


#: requests in a row through one proxy that failed the way a proxy fails (its connection closed
#: or timed out before an answer, 502, 503 or 504, a CONNECT refused), for two sites or more,
#: after which the proxy, not the sites, is taken to be down: the crawl stops (ProxyWatch)
PROXY_FAILURES = 10
#: a proxy's answers when it could not carry a request (RFC 9110 15.6.3-5)
GATEWAY_ERRORS = frozenset({502, 503, 504})
#: how a request through a proxy fails when the proxy itself may be down
_PROXY_FAILS = frozenset({ExitCode.NETWORK_ERROR, ExitCode.PROTOCOL_ERROR, ExitCode.PROXY_ERROR,
                          ExitCode.TIMEOUT})


@dataclass(frozen=True, slots=True)
class Proxy:
    """An HTTP proxy: where to connect, and the Proxy-Authorization value if it has one."""

    host: str
    port: int
    authorization: str | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"proxy {host}:{self.port}"


def parse_proxy(url: str) -> Proxy:
    """A proxy URL as a Proxy (ValueError naming what is wrong)."""
    text = url.strip()
    parts = urlsplit(text if "://" in text else "http://" + text)
    if parts.scheme.lower() != "http":
        raise ValueError(f"only http:// proxies are supported, not {parts.scheme}://")
    try:
        port = parts.port or 80
    except ValueError:
        raise ValueError(f"bad port in proxy URL {hidden(text)!r}") from None
    if not parts.hostname:
        raise ValueError(f"no host in proxy URL {hidden(text)!r}")
    auth = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        auth = "Basic " + base64.b64encode(pair.encode()).decode()
    return Proxy(parts.hostname, port, auth)


def hidden(url: str) -> str:
    """A proxy URL without its password, for messages."""
    scheme, sep, rest = url.rpartition("://")
    user, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{user.partition(':')[0]}:***@{host}" if at else url


@dataclass(slots=True)
class _Streak:
    """Failures in a row through one proxy: how many, for which sites, and the last request
    sent before the first of them failed."""

    before: int
    count: int = 0
    sites: set[str] = field(default_factory=set)


class ProxyWatch:
    """The requests in a row that failed through each proxy, and the sites they were for: past
    `most` of them for two sites or more, with no answer between, the proxy is down (a site
    down behind it fails alone; one site: its failures stay its own, for its patience).

    Hosts that do not exist fail fast through a working proxy, so it is judged only once every
    request under way when the first of the failures came has ended, and once it has answered,
    only failures for sites it answered count: a broad crawl's dead sites neither stop it at its
    start, before the first real answer, nor at its end, when they are all that is left."""

    def __init__(self, most: int = PROXY_FAILURES) -> None:
        self.most = most
        self._sent = 0  # the tickets handed out
        self._under_way: dict[Proxy, set[int]] = {}
        self._streaks: dict[Proxy, _Streak] = {}
        self._reached: dict[Proxy, set[str]] = {}  # the sites it answered for

    @contextlib.contextmanager
    def carrying(self, proxy: Proxy, site: str) -> Iterator[Carried]:
        """A request for the site through the proxy, under way while in this block."""
        self._sent += 1
        carried = Carried(self, proxy, self._sent, site)
        under_way = self._under_way.setdefault(proxy, set())
        under_way.add(carried.ticket)
        try:
            yield carried
        finally:
            under_way.discard(carried.ticket)

    def answered(self, carried: Carried, status: int) -> None:
        """A response came through the proxy (ProxyFailure: its own 502/503/504, once too
        many)."""
        if status in GATEWAY_ERRORS:
            self._failed(carried, f"it answered {status}")
        else:
            self._streaks.pop(carried.proxy, None)
            self._reached.setdefault(carried.proxy, set()).add(carried.site)

    def failed(self, carried: Carried, exc: FetchError) -> None:
        """A request through the proxy failed (ProxyFailure: once too many the proxy's way)."""
        if exc.exit_code in _PROXY_FAILS:
            self._failed(carried, exc.detail)

    def _failed(self, carried: Carried, why: str) -> None:
        proxy, site = carried.proxy, carried.site
        reached = self._reached.get(proxy)
        if reached and site not in reached:
            return  # a site never reached through a proxy that works fails on its own
        streak = self._streaks.setdefault(proxy, _Streak(before=self._sent))
        streak.count += 1
        streak.sites.add(site)
        if streak.count < self.most or len(streak.sites) < 2:
            return
        if any(t <= streak.before for t in self._under_way[proxy] if t != carried.ticket):
            return  # a request sent before the failures began may yet be answered
        raise ProxyFailure(f"{proxy} failed the last {streak.count} requests, for "
                           f"{len(streak.sites)} sites, with no answer between (the last: "
                           f"{one_line(why)}): it is taken to be down")


@dataclass(frozen=True, slots=True)
class Carried:
    """A request under way through a proxy, as its watch knows it."""

    watch: ProxyWatch
    proxy: Proxy
    ticket: int
    site: str


class Proxies:
    """The proxies of http and https URLs, and the hosts that bypass them (no_proxy); the
    watch on them."""

    def __init__(self, http: Proxy | None, https: Proxy | None, no_proxy: str = "") -> None:
        self._by_scheme = {"http": http, "https": https}
        self.watch = ProxyWatch()
        entries = [e.strip().lower() for e in no_proxy.split(",") if e.strip()]
        self._everything = "*" in entries
        self._names: list[tuple[str, int | None]] = []
        self._networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in entries:
            try:
                self._networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            name, port = _host_port(entry)
            self._names.append((name.removeprefix("*").lstrip("."), port))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], proxy: str | None = None
                         ) -> Proxies | None:
        """The configured proxy, or the environment's (None: every request goes direct).

        ValueError for a proxy URL that cannot be used, naming the variable or key.
        """
        def read(*names: str) -> tuple[str, str]:
            """The first of the variables set (each in lower case, else upper case), and its
            value: a mistake is named by the variable the user set."""
            for name in names:
                for variable in (name, name.upper()):
                    if environ.get(variable):
                        return variable, environ[variable]
            return names[0], ""

        if proxy:
            http = https = _parsed("proxy", proxy)
        else:
            http = _parsed(*read("http_proxy", "all_proxy"))
            https = _parsed(*read("https_proxy", "all_proxy"))
        if http is None and https is None:
            return None
        return cls(http, https, read("no_proxy")[1])

    def for_url(self, scheme: str, host: str, port: int) -> Proxy | None:
        """The proxy for a request to host:port (host in lower case, IPv6 without brackets)."""
        proxy = self._by_scheme.get(scheme)
        if proxy is None or self._everything:
            return None
        for name, only_port in self._names:
            if (host == name or host.endswith("." + name)) and only_port in (None, port):
                return None
        if self._networks:
            try:
                address = ipaddress.ip_address(host)
            except ValueError:
                return proxy
            if any(address in network for network in self._networks):
                return None
        return proxy


def _parsed(name: str, url: str) -> Proxy | None:
    """The proxy a variable or key names (ValueError naming it)."""
    try:
        return parse_proxy(url) if url else None
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _host_port(entry: str) -> tuple[str, int | None]:
    """A no_proxy entry's host and port, if it names one."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = entry.partition(":") if entry.count(":") == 1 else (entry, "", "")
    return host, int(port) if port.isdigit() else None


async def proxy_socket(loop: asyncio.AbstractEventLoop, proxy: Proxy) -> socket.socket:
    """A connected, non-blocking socket to the proxy (its addresses tried in turn; the proxy
    is the user's choice, so the address guard does not apply to it); ProxyFailure if none
    answers."""
    try:
        return await _connect(loop, proxy)
    except OSError as exc:
        raise ProxyFailure(f"{proxy}: {one_line(exc)}") from None


async def _connect(loop: asyncio.AbstractEventLoop, proxy: Proxy) -> socket.socket:
    error: OSError = OSError("no address")
    for family, kind, proto, _, address in await loop.getaddrinfo(
            proxy.host, proxy.port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise error


async def open_tunnel(loop: asyncio.AbstractEventLoop, sock: socket.socket, proxy: Proxy,
                      authority: str, max_head: int) -> None:
    """Ask the proxy for a tunnel to authority (host:port) with CONNECT; FetchError
    (PROXY_ERROR) when it does not answer 2xx within `max_head` bytes (limits.max_header_size)."""
    request = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
    if proxy.authorization:
        request += f"Proxy-Authorization: {proxy.authorization}\r\n"
    await loop.sock_sendall(sock, (request + "\r\n").encode("utf-8", "replace"))
    answer = b""
    while b"\r\n\r\n" not in answer:  # the proxy says nothing more until the TLS handshake
        data = await loop.sock_recv(sock, 65536)
        if not data or len(answer) > max_head:
            raise FetchError(ExitCode.PROXY_ERROR, f"{proxy} closed the tunnel to {authority} "
                             "before answering CONNECT")
        answer += data
    status = answer.partition(b"\r\n")[0].decode("latin-1")
    code = status.partition(" ")[2][:3]
    if code == "407":
        raise refused(proxy)
    if not code.startswith("2"):  # this site only (the proxy's policy, or the site is down)
        raise FetchError(ExitCode.PROXY_ERROR,
                         f"{proxy} refused CONNECT {authority}: {status[:200]}")


def refused(proxy: Proxy) -> ProxyFailure:
    """The proxy's 407."""
    given = "its credentials were refused" if proxy.authorization else "give them in its URL"
    return ProxyFailure(f"{proxy} answered 407 Proxy Authentication Required ({given})")


def absolute_form(request: bytes, scheme: str, authority: str, proxy: Proxy | None) -> bytes:
    """The request as sent: to a proxy, an http URL's target with the origin (absolute form,
    RFC 9112 3.2.2) and the proxy's credentials; else (direct, or https through a tunnel) as
    it is."""
    if proxy is None or scheme != "http":
        return request
    origin = f"http://{authority}"
    line, _, rest = request.partition(b"\r\n")
    method, _, target = line.partition(b" ")
    line = b"%s %s%s" % (method, origin.encode(), target)
    if proxy.authorization:
        line += b"\r\nProxy-Authorization: " + proxy.authorization.encode()
    return line + b"\r\n" + rest
