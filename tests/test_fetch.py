"""The HTTP client alone against the hostile server: every fault becomes one FetchError."""

from __future__ import annotations

import asyncio
import gc
import gzip
import ipaddress
import socket
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import brotli
import pytest
import zstandard

from courtly.config import Limits
from courtly.connection import Connection, Decoder
from courtly.fetch import (
    NEXT_ATTEMPT,
    Addresses,
    Fetcher,
    FetchError,
    GuardedResolver,
    SystemResolver,
    _BlockedAddress,
    _literal,
    interleaved,
)
from courtly.fetch import address_allowed as allowed
from courtly.model import ExitCode
from courtly.urls import bare_host
from tests.hostile_server import (
    HostileServer,
    close_at_once,
    drip,
    endless,
    fixed,
    gzip_bomb,
    header_flood,
    page,
    reset_mid_body,
    response,
    silent,
    stall_after_headers,
)

#: a page's text, compressed by each Content-Encoding
CODINGS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress,
    "zstd": zstandard.compress}


def cut_short(coding: str) -> bytes:
    """A compressed page whose Content-Length says half of it (the rest follows)."""
    body = CODINGS[coding](b"<html><body>" + b"".join(b"<p>%d</p>" % i for i in range(5000)))
    return response("200 OK", {"Content-Type": "text/html", "Content-Encoding": coding,
                               "Content-Length": str(len(body) // 2)}, body)


LIMITS = Limits(connect_timeout=1, first_byte_timeout=0.4, read_timeout=0.6, total_timeout=1.2,
                max_body_size=1 << 20, max_decompressed_size=4 << 20, max_header_count=50,
                max_header_size=4096)

FAULTS: dict[str, tuple[Any, ExitCode, str]] = {
    # name: (fault, exit code, a word of the detail)
    "silent": (silent, ExitCode.TIMEOUT, "first-byte"),
    "stall": (stall_after_headers(), ExitCode.TIMEOUT, "read-idle"),
    "drip": (drip(0.2), ExitCode.TIMEOUT, "total"),
    "endless": (endless(), ExitCode.TOO_LARGE, "cut off"),
    "declared": (endless(chunked=False, declared=200_000_000), ExitCode.TOO_LARGE,
                 "Content-Length"),
    "undeclared": (endless(chunked=False), ExitCode.TOO_LARGE, "cut off"),
    "gzip-bomb": (fixed(page(gzip_bomb(40 << 20), Content_Encoding="gzip")),
                  ExitCode.TOO_LARGE, "decompressed"),
    "br-bomb": (fixed(page(brotli.compress(b"\0" * (20 << 20)), Content_Encoding="br")),
                ExitCode.TOO_LARGE, "decompressed"),
    "bad-status": (fixed(b"HTTP/1.1 abc nonsense\r\n\r\n"), ExitCode.PROTOCOL_ERROR, "status"),
    "no-status": (fixed(b"<html>HTTP/0.9 style, no status line</html>"),
                  ExitCode.PROTOCOL_ERROR, "status"),
    "bad-chunks": (fixed(response("200 OK", {"Transfer-Encoding": "chunked"}, b"zz\r\nhi\r\n")),
                   ExitCode.PROTOCOL_ERROR, "chunk"),
    "short-body": (fixed(response("200 OK", {"Content-Length": "1000"}, b"short")),
                   ExitCode.PROTOCOL_ERROR, "not completed"),
    "reset": (reset_mid_body, ExitCode.PROTOCOL_ERROR, "not completed"),
    "empty": (close_at_once, ExitCode.PROTOCOL_ERROR, "disconnected"),
    "bad-gzip": (fixed(page(b"not gzip", Content_Encoding="gzip")), ExitCode.PROTOCOL_ERROR,
                 "compressed"),
    "bad-br": (fixed(page(b"not brotli", Content_Encoding="br")), ExitCode.PROTOCOL_ERROR,
               "compressed"),
    "zstd-bomb": (fixed(page(zstandard.compress(b"\0" * (20 << 20)), Content_Encoding="zstd")),
                  ExitCode.TOO_LARGE, "decompressed"),
    "bad-zstd": (fixed(page(b"not zstd", Content_Encoding="zstd")), ExitCode.PROTOCOL_ERROR,
                 "compressed"),
    # the whole compressed body sent, a Content-Length that ends it halfway: each stream
    # decodes without error as far as it goes
    **{f"{coding}-cut-short": (fixed(cut_short(coding)), ExitCode.PROTOCOL_ERROR, "cut short")
       for coding in ("gzip", "deflate", "br", "zstd")},
    "odd-encoding": (fixed(page(b"xx", Content_Encoding="compress")), ExitCode.PROTOCOL_ERROR,
                     "Content-Encoding"),
    "header-count": (fixed(header_flood(1000)), ExitCode.TOO_LARGE, "headers"),
    "header-size": (fixed(header_flood(1, 100_000)), ExitCode.TOO_LARGE, "headers"),
    "bad-length": (fixed(response("200 OK", {"Content-Length": "-5"}, b"x")),
                   ExitCode.PROTOCOL_ERROR, "Content-Length"),
}


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    faults = {name: f for name, (f, _, _) in FAULTS.items()}
    faults["ok"] = fixed(page("<html>fine</html>"))
    faults["deflate-raw"] = fixed(page(zlib.compress(b"raw deflate")[2:-4],
                                       Content_Encoding="deflate"))
    faults["gzip-members"] = fixed(page(gzip.compress(b"one ") + gzip.compress(b"two"),
                                        Content_Encoding="gzip"))
    faults["zstd"] = fixed(page(zstandard.compress(b"<html>zstd</html>"),
                                Content_Encoding="zstd"))
    faults["gzip-gzip"] = fixed(page(gzip.compress(gzip.compress(b"twice")),
                                     Content_Encoding="gzip, gzip"))
    faults["br-then-gzip"] = fixed(page(gzip.compress(brotli.compress(b"br, then gzip")),
                                        Content_Encoding="br,gzip"))
    with HostileServer(faults) as server:
        yield server


async def fetch(url: str, limits: Limits = LIMITS, **kw: Any) -> Any:
    async with Fetcher(limits, "courtly-test", {"127.0.0.1"}) as fetcher:
        return await fetcher.get(url, **kw)


@pytest.mark.parametrize("name", list(FAULTS))
def test_each_fault_is_one_fetch_error_in_bounded_time(hostile: HostileServer, name: str) -> None:
    _, code, word = FAULTS[name]
    started = time.monotonic()
    with pytest.raises(FetchError) as info:
        asyncio.run(fetch(hostile.url(name)))
    took = time.monotonic() - started
    assert info.value.exit_code is code, info.value.detail
    assert word.lower() in info.value.detail.lower()
    assert "\n" not in info.value.detail and len(info.value.detail) <= 300
    assert took < LIMITS.total_timeout + 0.5
    hits = hostile.hits_for(name)
    assert hits, "the fault was never reached"
    last = hits[-1]
    deadline = time.monotonic() + 1
    while not last.ended and time.monotonic() < deadline:
        time.sleep(0.02)
    assert last.ended, "the connection is still open"
    # the server saw the client hang up at the limit, not later
    assert last.ended - last.arrived < LIMITS.total_timeout + 0.3
    if name == "endless":
        # cut off, not read to the end (what was sent past the limit sits in socket buffers)
        assert last.sent < 16 * LIMITS.max_body_size and last.client_closed


def test_well_formed_answers_still_work(hostile: HostileServer) -> None:
    ok = asyncio.run(fetch(hostile.url("ok")))
    assert ok.status == 200 and ok.body == b"<html>fine</html>"
    assert asyncio.run(fetch(hostile.url("deflate-raw"))).body == b"raw deflate"
    assert asyncio.run(fetch(hostile.url("gzip-members"))).body == b"one two"


def test_zstd_and_stacked_codings_are_decoded(hostile: HostileServer) -> None:
    """A `Content-Encoding: zstd` body (courtly does not ask for it; a server answering Chrome's
    Accept-Encoding may send it anyway) and codings applied in turn (`gzip, gzip`) were a
    PROTOCOL_ERROR, "unsupported Content-Encoding". zstd is decoded (a bomb cut off as gzip's
    is, FAULTS), and stacked codings are undone in turn."""
    assert asyncio.run(fetch(hostile.url("zstd"))).body == b"<html>zstd</html>"
    assert asyncio.run(fetch(hostile.url("gzip-gzip"))).body == b"twice"
    assert asyncio.run(fetch(hostile.url("br-then-gzip"))).body == b"br, then gzip"
    bomb = Decoder("gzip, gzip", 1 << 20)
    with pytest.raises(FetchError) as info:
        bomb.feed(gzip.compress(gzip_bomb(64 << 20)))
    assert info.value.exit_code is ExitCode.TOO_LARGE


def test_a_closed_connection_is_freed_at_once(hostile: HostileServer) -> None:
    """No cycle left for the garbage collector: a broad crawl opens a connection a request."""

    async def run() -> None:
        async with Fetcher(LIMITS, "courtly-test", {"127.0.0.1"}) as fetcher:
            for _ in range(3):
                await fetcher.get(hostile.url("ok"), keep_alive=False)
            with pytest.raises(FetchError):
                await fetcher.get(hostile.url("silent"))

    gc.collect()
    gc.disable()
    try:
        asyncio.run(run())
        left = [o for o in gc.get_objects() if isinstance(o, Connection)]
    finally:
        gc.enable()
    assert left == []


def test_truncate_keeps_exactly_the_first_bytes(hostile: HostileServer) -> None:
    resp = asyncio.run(fetch(hostile.url("endless"), max_body=100_000, truncate=True))
    assert len(resp.body) == 100_000
    assert resp.body.startswith(b"<p>aaa")


def test_truncate_cuts_a_compressed_body_where_it_is_decoded(hostile: HostileServer) -> None:
    """robots.txt is read with truncate: a plain body over its limit was cut there and obeyed,
    but a gzipped one was inflated up to max_decompressed_size, then refused (TOO_LARGE): its
    origin was "robots.txt unavailable", disallowed and given up after a bomb inflated 50 MiB
    on the event loop at each try. The decoded body is cut at the limit, as a plain one is."""
    resp = asyncio.run(fetch(hostile.url("gzip-bomb"), max_body=100_000, truncate=True))
    assert resp.body == b"\0" * 100_000
    small = asyncio.run(fetch(hostile.url("gzip-members"), max_body=100_000, truncate=True))
    assert small.body == b"one two"


def test_first_byte_and_read_idle_timeouts_are_told_apart(hostile: HostileServer) -> None:
    slow_reader = Limits(first_byte_timeout=2, read_timeout=0.3, total_timeout=3)
    with pytest.raises(FetchError) as info:
        asyncio.run(fetch(hostile.url("silent"), slow_reader))
    assert info.value.exit_code is ExitCode.TIMEOUT and "read-idle" in info.value.detail


def test_decoder_cuts_a_bomb_without_inflating_it() -> None:
    bomb = gzip_bomb(64 << 20)
    decoder = Decoder("gzip", 1 << 20)
    with pytest.raises(FetchError) as info:
        for i in range(0, len(bomb), 16384):
            out = decoder.feed(bomb[i:i + 16384])
            assert len(out) <= (1 << 20) + 1
    assert info.value.exit_code is ExitCode.TOO_LARGE
    assert decoder.size <= (1 << 20) + 1


# -- the address guard -----------------------------------------------------------------------
@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.0.0.2", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
    "100.64.0.1", "0.0.0.0", "224.0.0.1", "240.0.0.1", "255.255.255.255", "192.0.2.1", "::1",
    "::", "fe80::1%eth0", "fc00::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
    "2002:7f00:1::", "2001:db8::1", "not an address",
])
def test_address_guard_refuses_non_public_addresses(address: str) -> None:
    assert not allowed(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "93.184.216.34", "2606:4700::1111",
                                     "::ffff:8.8.8.8"])
def test_address_guard_allows_public_addresses(address: str) -> None:
    assert allowed(address)


def test_address_guard_allows_a_seed_host() -> None:
    assert allowed("127.0.0.1", {"127.0.0.1"})
    assert not allowed("127.0.0.2", {"127.0.0.1"})


class FakeResolver:
    """DNS answers chosen by the test: {name: [addresses]}."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int) -> Addresses:
        self.asked.append(host)
        return [(a, socket.AF_INET6 if ":" in a else socket.AF_INET) for a in self.answers[host]]


def test_guarded_resolver_filters_every_answer() -> None:
    fake = FakeResolver({
        "public.test": ["93.184.216.34"],
        "rebind.test": ["127.0.0.1"],
        "mixed.test": ["10.0.0.1", "93.184.216.34", "169.254.169.254"],
        "seed.test": ["127.0.0.1"],
        "meta.test": ["169.254.169.254", "::1"],
    })
    guard = GuardedResolver(frozenset({"seed.test"}), inner=fake)

    async def resolve(name: str) -> list[str]:
        return [address for address, _ in await guard.resolve(name, 80)]

    assert asyncio.run(resolve("public.test")) == ["93.184.216.34"]
    assert asyncio.run(resolve("mixed.test")) == ["93.184.216.34"]
    assert asyncio.run(resolve("seed.test")) == ["127.0.0.1"]  # the seed's own host
    for name in ("rebind.test", "meta.test"):
        with pytest.raises(_BlockedAddress):
            asyncio.run(resolve(name))


def test_a_name_resolving_to_loopback_is_blocked_before_any_byte(hostile: HostileServer) -> None:
    """A URL whose name resolves to 127.0.0.1 (DNS rebinding) is refused, not connected to."""
    port = hostile.origins["ok"].rsplit(":", 1)[1]
    before = len(hostile.hits)

    async def run() -> None:
        async with Fetcher(LIMITS, "courtly-test", {"seed.test"}) as fetcher:
            fetcher._resolver = GuardedResolver(
                frozenset({"seed.test"}), FakeResolver({"evil.test": ["127.0.0.1"]}))
            await fetcher.get(f"http://evil.test:{port}/")

    with pytest.raises(FetchError) as info:
        asyncio.run(run())
    assert info.value.exit_code is ExitCode.BLOCKED_ADDRESS
    assert len(hostile.hits) == before


@pytest.mark.parametrize("host", ["127.0.0.2", "[::1]", "0.0.0.0", "169.254.169.254"])
def test_literal_addresses_are_refused_without_a_connection(host: str) -> None:
    with pytest.raises(FetchError) as info:
        asyncio.run(fetch(f"http://{host}:9/"))
    assert info.value.exit_code is ExitCode.BLOCKED_ADDRESS


def test_allow_private_addresses_turns_the_guard_off(hostile: HostileServer) -> None:
    port = hostile.origins["ok"].rsplit(":", 1)[1]

    async def run() -> int:
        lim = LIMITS.model_copy(update={"allow_private_addresses": True})
        async with Fetcher(lim, "courtly-test", ()) as fetcher:  # no seed host at all
            return (await fetcher.get(f"http://127.0.0.1:{port}/")).status

    assert asyncio.run(run()) == 200


def test_another_name_for_the_seed_address_is_not_the_seed_host() -> None:
    """Seed 127.0.0.1: "localhost" also resolves to 127.0.0.1, but it is not the seed's host."""
    guard = GuardedResolver(frozenset({"127.0.0.1"}),
                            FakeResolver({"localhost": ["127.0.0.1", "::1"]}))
    with pytest.raises(_BlockedAddress):
        asyncio.run(guard.resolve("localhost", 80))


def test_an_ipv6_seed_host_is_its_own_host() -> None:
    """A seed http://[::1]:PORT/ is allowed: hosts are compared without brackets."""

    async def run() -> None:
        async with Fetcher(LIMITS, "courtly-test", {bare_host("http://[::1]:8000/")}) as fetcher:
            fetcher._check_literal_address("::1")
            fetcher._check_literal_address("[::1]")
            with pytest.raises(FetchError):
                fetcher._check_literal_address("127.0.0.1")

    asyncio.run(run())


def test_the_system_resolver_answers_each_address_once() -> None:
    """localhost resolves through getaddrinfo to loopback addresses, no repeats."""
    answers = asyncio.run(SystemResolver().resolve("localhost", 80))
    assert ("127.0.0.1", socket.AF_INET) in answers
    assert len(answers) == len(set(answers))
    assert {family for _, family in answers} <= {socket.AF_INET, socket.AF_INET6}


# -- several addresses: happy eyeballs ------------------------------------------------------


@contextmanager
def black_hole(address: str, port: int) -> Iterator[None]:
    """address:port drops every SYN: a listener whose one-place backlog is already full."""
    listener = socket.socket()
    queued = socket.socket()
    try:
        listener.bind((address, port))
        listener.listen(0)
        queued.connect((address, port))  # never accepted: the queue is full from now on
        yield
    finally:
        queued.close()
        listener.close()


def fetch_named(hostile: HostileServer, addresses: list[str], limits: Limits = LIMITS) -> Any:
    """GET http://dual.test:PORT/ of the hostile server's 'ok' origin, the name resolving to
    these addresses in this order."""
    port = hostile.origins["ok"].rsplit(":", 1)[1]

    async def run() -> Any:
        lim = limits.model_copy(update={"allow_private_addresses": True})
        async with Fetcher(lim, "courtly-test", ()) as fetcher:
            fetcher._resolver = FakeResolver({"dual.test": addresses})
            return await fetcher.get(f"http://dual.test:{port}/")

    return asyncio.run(run())


def test_a_silent_address_does_not_stall_the_next(hostile: HostileServer) -> None:
    """The first address drops SYNs: the second is tried NEXT_ATTEMPT later, not after the
    connect timeout, and answers."""
    port = int(hostile.origins["ok"].rsplit(":", 1)[1])
    slow = LIMITS.model_copy(update={"connect_timeout": 5, "first_byte_timeout": 5,
                                     "total_timeout": 5})
    with black_hole("127.0.0.2", port):
        started = time.monotonic()
        response = fetch_named(hostile, ["127.0.0.2", "127.0.0.1"], slow)
        took = time.monotonic() - started
    assert response.status == 200
    assert NEXT_ATTEMPT <= took < 2.5  # the second attempt waited for the first, not for 5 s


def test_a_refused_address_falls_through_at_once(hostile: HostileServer, monkeypatch) -> None:
    monkeypatch.setattr("courtly.fetch.NEXT_ATTEMPT", 10.0)  # only a failure can start the next
    started = time.monotonic()
    response = fetch_named(hostile, ["127.0.0.3", "127.0.0.1"])  # nothing listens on .3
    assert response.status == 200 and time.monotonic() - started < 5


def test_every_address_failing_is_one_network_error(hostile: HostileServer) -> None:
    with pytest.raises(FetchError) as info:
        fetch_named(hostile, ["127.0.0.3", "127.0.0.4"])
    assert info.value.exit_code is ExitCode.NETWORK_ERROR
    assert "connect" in str(info.value)


@pytest.mark.parametrize("host", [
    "127.1.0.1", "0.0.0.0", "255.255.255.255", "::1", "fe80::1%eth0", "::ffff:1.2.3.4",
    "01.2.3.4", "1.2.3.04", "1.2.3", "1.2.3.4.", "256.1.1.1", "0x1.2.3.4", " 1.2.3.4",
    "1.2.3.4/32", "\u0661.2.3.4", "1.2.3.4\x00", "[::1]", "example.com", "",
])
def test_an_ip_literal_is_what_ipaddress_parses(host: str) -> None:
    """The fetcher's IPv4 test (the C parser, no cache) agrees with ipaddress on every form."""
    try:
        ipaddress.ip_address(host)
        expected = True
    except ValueError:
        expected = False
    assert _literal(host) is expected


def test_address_families_alternate_from_the_first_answer() -> None:
    v6, v4 = socket.AF_INET6, socket.AF_INET
    answers = [("::2", v6), ("::3", v6), ("::4", v6), ("10.0.0.1", v4)]
    assert interleaved(answers) == [("::2", v6), ("10.0.0.1", v4), ("::3", v6), ("::4", v6)]
    assert interleaved([("10.0.0.1", v4), ("::2", v6)]) == [("10.0.0.1", v4), ("::2", v6)]
    assert interleaved([]) == []
