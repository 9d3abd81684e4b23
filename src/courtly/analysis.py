"""The CPU work on one HTML page, and the page worker process that does it (`serve`).

`analyse_page` is a pure function of the body and the settings: parse the HTML, read the
directives, resolve and normalize the links, compute the near-duplicate signature, compress the
body for storage. The crawler runs it through a `pageworker.PageWorker`, in the worker process
or inline.

The worker process imports this module alone: no asyncio, no configuration (its settings come
as plain values, `PageSettings`), so it starts in a tenth of a second less CPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import pickle
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import zstandard

from courtly.parse import link_canonical, parse_html, refresh_redirect, robots_directives
from courtly.urls import NormalizeRules, Rules, authority_key, normalize, normalize_links

LENGTH = 4  # bytes of the little-endian length before each message
#: the worker's first garbage-collector threshold (CPython's is 700): a page's links and their
#: tuples made a young collection every few hundred links, each scanning what the last pages
#: left; with the modules frozen after the warm-up page, 3-5 % of a real page's CPU less
YOUNG_OBJECTS = 10_000
#: level 1, not zstd's default 3: as small on HTML (bench pages: 3,199 bytes against 3,226) in
#: three quarters of the time
_ZSTD = zstandard.ZstdCompressor(level=1)
#: an exchange of up to this many bytes is stored as it is, in a zstd frame: level 1 took 48,000
#: instructions to take a synthetic page's 398 bytes to 296 (a real site's 1,314 to 826)
STORED_EXCHANGE = 1024
#: a zstd frame's magic number and header descriptor: one segment, its size in 4 bytes (RFC 8878)
_STORED_FRAME = b"\x28\xb5\x2f\xfd\xa0"


@dataclass(frozen=True, slots=True)
class PageSettings:
    """What analyse_page needs from the configuration (sent to the worker once)."""

    token: str
    max_links: int
    max_parse_size: int
    near: bool  # compute the near-duplicate signature ([dedup] near)
    min_words: int  # of a main content of at least this many words ([dedup] min_words)
    normalize: Rules
    compress: bool  # compress the body for storage
    anchors: bool = True  # extract anchor texts (only a strategy's own link handlers read them)


@dataclass(slots=True)
class PageAnalysis:
    """The result of the CPU work on one HTML page (sent back as `astuple`)."""

    noindex: bool = False
    nofollow: bool = False
    #: the normalized canonical URL when it names another page (the page is then discarded,
    #: unless the canonical URL is another origin's and not in the crawl's scope)
    canonical: str | None = None
    #: the link element's and the Link header's canonical URLs when they name different ones:
    #: neither is followed, the page is kept as its own
    canonicals: tuple[str, str] | None = None
    #: a meta refresh to another URL within parse.MAX_REFRESH_DELAY: its normalized URL and delay
    #: (the page is a redirect: nothing else is read)
    refresh: tuple[str, int] | None = None
    #: read no further than its canonical URL, of its own origin (analyse_page's `own`)
    partial: bool = False
    title: str | None = None
    #: (normalized URL, anchor text) of the followable links, in page order, without repeats
    #: or the page itself; empty when the page is nofollow
    links: list[tuple[str, str]] = field(default_factory=list)
    near_signature: bytes | None = None
    #: the body compressed for the content table (settings.compress), unless noindex
    content: bytes | None = None
    #: the HTTP exchange (request and response head) with it, for WARC records (compress_exchange)
    exchange: bytes | None = None


def compress(body: bytes) -> bytes:
    """A body as the content table stores it: zstd, level 1."""
    return _ZSTD.compress(body)


def compress_exchange(exchange: bytes) -> bytes:
    """An HTTP exchange as the store keeps it: one zstd frame (every zstd reads it), compressed
    only past STORED_EXCHANGE bytes."""
    size = len(exchange)
    if size > STORED_EXCHANGE:
        return _ZSTD.compress(exchange)
    # by hand: python-zstandard has no level that stores; one last raw block, its 3-byte header
    return (_STORED_FRAME + size.to_bytes(4, "little") + (size << 3 | 1).to_bytes(3, "little")
            + exchange)


def header_canonical(url: str, link: str, opts: NormalizeRules) -> str | None:
    """The canonical URL a response's Link header names (`link`: its value), normalized and
    resolved against the response's URL (a page's `<base href>` is not the header's)."""
    target = link_canonical(link) if "canonical" in link.lower() else None
    return None if target is None else normalize(target, url, opts)


def analyse_page(
    settings: PageSettings, url: str, body: bytes, content_type: str | None, x_robots_tag: str,
    exchange: bytes = b"", link: str = "", own: bool = False,
) -> PageAnalysis:
    """Parse one HTML page: meta refresh, directives, canonical (the link element's, or the Link
    header's: `link`), normalized links, near-duplicate signature; compress the body and the
    exchange for storage. own: the page is kept as its own whatever its canonical URL (read
    whole, as a page whose canonical URL is another origin's is)."""
    page = parse_html(
        body, content_type, settings.token, settings.max_links, want_text=settings.near,
        max_bytes=settings.max_parse_size, want_anchors=settings.anchors,
    )
    noindex, nofollow = robots_directives(x_robots_tag, settings.token)
    out = PageAnalysis(noindex | page.noindex, nofollow | page.nofollow, title=page.title)
    opts, encoding = settings.normalize, page.encoding  # a link's query is in the page's
    base = (normalize(page.base, url, opts, encoding) if page.base else None) or url
    if (redirect := refresh_redirect(page.refresh, base, url, opts, encoding)) is not None:
        out.refresh = redirect
        return out
    element = normalize(page.canonical, base, opts, encoding) if page.canonical else None
    header = header_canonical(url, link, opts)
    if element and header and element != header:
        out.canonicals = element, header
    elif (canonical := element or header) and canonical != url:
        out.canonical = canonical
        if not own and authority_key(canonical) == authority_key(url):
            # in the page's origin, so in scope: the page is discarded, unless the crawl would
            # never keep its canonical URL (content.py: then it asks again, `own`)
            out.partial = True
            return out
        # another origin's: the crawl keeps the page if that one is not in its scope
    if settings.near and not out.noindex:
        out.near_signature = _minhash()(page.text, settings.min_words)
    if settings.compress and not out.noindex:
        out.content = compress(body)
        out.exchange = compress_exchange(exchange) if exchange else None
    if out.nofollow:
        return out
    # each href once, with its first anchor text: a page repeats its links (a rustdoc page's
    # 240 links are 108 hrefs), and resolving one costs more than a dictionary lookup
    followed: dict[str, str] = {}
    for href, text, nofollow in page.links:
        if not nofollow and href not in followed:
            followed[href] = text
    seen: set[str] = set()
    links = out.links
    targets = normalize_links(list(followed), base, opts, encoding)
    for target, text in zip(targets, followed.values(), strict=True):
        if target is None or target in seen or target == url:
            continue
        seen.add(target)
        links.append((target, text))
    return out


@functools.cache
def _minhash() -> Callable[[str, int], bytes | None]:
    """minhash.signature, imported on first use: the crawl process loads NumPy only if it
    analyses pages itself (an import statement in analyse_page cost 5,000 instructions a page)."""
    from courtly.minhash import signature

    return signature


def astuple(page: PageAnalysis) -> tuple[object, ...]:
    """The fields in order: a tuple pickles in a third of a slotted dataclass's time."""
    return (page.noindex, page.nofollow, page.canonical, page.canonicals, page.refresh,
            page.partial, page.title, page.links, page.near_signature, page.content, page.exchange)


# -- the worker process ------------------------------------------------------------------------
#: prctl's option: the signal this process gets when its parent dies (linux/prctl.h)
_PR_SET_PDEATHSIG = 1
_WARM_UP = (b"<html><head><title>ready</title></head><body><p>" + b"a warm-up page " * 40
            + b'<a href="/next">next</a></p></body></html>')


def _die_with_crawler() -> None:
    """Linux: the kernel kills this worker when the crawl process dies (prctl PDEATHSIG). After
    kill -9 the end of file came only once the page at hand was done: a page slow to parse
    kept an orphan busy for minutes (the watchdog is the crawler's). Elsewhere: end of file."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: no prctl
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def serve(sock: socket.socket) -> None:
    """Answer analysis requests in order until end of file (the crawler closed or died)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the crawler stops us by closing the socket
    _die_with_crawler()
    stream = sock.makefile("rb")
    settings: PageSettings | None = None
    with contextlib.suppress(OSError):  # the crawler is gone
        while True:
            head = stream.read(LENGTH)
            if len(head) < LENGTH:
                return
            data = stream.read(int.from_bytes(head, "little"))
            if settings is None:
                settings = pickle.loads(data)
                # what a first page would load (NumPy, the parser's tables), then "ready": the
                # crawler's watchdog times pages from here, not from the process's start
                analyse_page(settings, "http://ready.invalid/", _WARM_UP, "text/html", "")
                gc.freeze()  # the modules and their tables: never scanned again
                gc.set_threshold(YOUNG_OBJECTS, *gc.get_threshold()[1:])
                sock.sendall(bytes(LENGTH))
                continue
            try:
                page = analyse_page(settings, *pickle.loads(data))
                out = pickle.dumps(astuple(page), protocol=5)
            except Exception:  # the crawler analyses this page inline, and sees why
                out = b""
            sock.sendall(len(out).to_bytes(LENGTH, "little") + out)
