"""Sitemaps (sitemaps.org): a <urlset> of page URLs or a <sitemapindex> of sitemaps, maybe gzipped;
also what the protocol accepts in their place, an RSS 2.0 or Atom feed (its items' links) and a
text file of one URL a line. A <urlset>'s or <sitemapindex>'s entries' <lastmod> is read too (an
RSS item's <pubDate>, an Atom entry's <updated>), and believed as docs/recrawl.md says
(`Sitemap.modified`); <changefreq> and <priority> are not read. XML may be UTF-8 or UTF-16, with
or without a BOM or a namespace.

Parsed with the standard library's expat (which refuses entity-expansion bombs) in a streaming
pass; a sitemap that is not well-formed XML falls back to reading its <loc> elements with a regular
expression, as search engines do. The limits are `limits.max_sitemap_entries` (the protocol's
50,000) and `limits.max_decompressed_size` (50 MiB, the protocol's 50 MB uncompressed: a gzipped
sitemap's, and the fetcher's for a body typed XML, RSS or Atom).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from xml.etree import ElementTree

from courtly.config import Limits
from courtly.connection import XML_TYPES, Decoder, media_type
from courtly.errors import FetchError
from courtly.scheduler import http_date

_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_TYPES = ("application/gzip", "application/x-gzip", "application/octet-stream")
_LOC = re.compile(rb"<loc>\s*([^<]+?)\s*</loc>", re.I)
_ROOT = re.compile(rb"<(?:\w+:)?(urlset|sitemapindex|rss|feed)[\s>]", re.I)
#: a document whose root element is a sitemap's or a feed's, in UTF-8
_XML_HEAD = re.compile(rb"(?:\xef\xbb\xbf)?\s*(?:(?:<\?[^>]*>|<!--.*?-->)\s*)*"
                       rb"<(?:\w+:)?(?:urlset|sitemapindex|rss|feed)[\s>]", re.I | re.S)
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
_URL_LINE = re.compile(rb"https?://\S+", re.I)
_TEXT_MAX_LINE = 2048  # a text sitemap's line longer than this is no URL
_ATOM = "{http://www.w3.org/2005/Atom}"


@dataclass(slots=True)
class Sitemap:
    """What one sitemap document lists."""

    kind: str  # "urlset", "sitemapindex", "rss", "feed" (Atom) or "text"
    locs: list[str] = field(default_factory=list)
    truncated: bool = False  # more entries than limits.max_sitemap_entries: the rest not read
    cut_short: bool = False  # gzipped, and the body ends inside the gzip stream
    #: the <lastmod> of the entries that have one that reads as a W3C datetime: (loc, time)
    lastmods: list[tuple[str, float]] = field(default_factory=list)

    @property
    def is_index(self) -> bool:
        """True for a sitemap index (its locs are sitemaps)."""
        return self.kind == "sitemapindex"

    def modified(self, now: float) -> list[tuple[str, float]]:
        """The entries whose <lastmod> can be believed at `now` (docs/recrawl.md): not one in
        the future, and none when two or more entries have a <lastmod> and all have the same
        (a CMS writing its clock's time or date into every entry)."""
        times = {when for _, when in self.lastmods}
        if len(times) == 1 and len(self.lastmods) > 1:
            return []
        return [(loc, when) for loc, when in self.lastmods if when <= now]

    @property
    def label(self) -> str:
        """What it is, for a crawl action's detail."""
        return {"sitemapindex": "sitemap index", "rss": "RSS feed", "feed": "Atom feed",
                "text": "text sitemap"}.get(self.kind, "sitemap")


def looks_like_sitemap(url: str, content_type: str | None, body: bytes) -> bool:
    """Cheap test before parsing: an XML or gzip response, or a .xml / .xml.gz URL; one typed
    HTML or text only when its body starts as a sitemap (`xml_head`, `_text_head`)."""
    ctype = media_type(content_type)
    path = url.split("?")[0].lower()
    if ctype == "text/plain":
        return _text_head(body)
    if ctype.startswith(("text/html", "application/xhtml")):
        return xml_head(body)
    return (
        ctype in XML_TYPES or ctype.endswith("+xml") or ctype in _GZIP_TYPES
        or path.endswith((".xml", ".xml.gz")) or body.startswith(_GZIP_MAGIC)
    )


def xml_head(body: bytes) -> bool:
    """The body starts as an XML sitemap, sitemap index or feed (after an XML declaration, a
    stylesheet and comments): one a server types text/html is read as what it is, not as an
    empty page."""
    return _XML_HEAD.match(body, 0, 4096) is not None


def _text_head(body: bytes) -> bool:
    """A text sitemap's start: its first line that is not blank is an http(s) URL."""
    first = body.removeprefix(b"\xef\xbb\xbf").lstrip()[:_TEXT_MAX_LINE].split(b"\n", 1)[0]
    return _URL_LINE.fullmatch(first.strip()) is not None


def gunzip(body: bytes, limit: int) -> tuple[bytes, bool]:
    """The first `limit` bytes of a gzip body, every member, and whether it ends inside one (cut
    short: read as far as it goes). A body that is not gzip is returned as is; one that does not
    decode gives b""."""
    if not body.startswith(_GZIP_MAGIC):
        return body, False
    decoder = Decoder("gzip", limit, truncate=True)
    try:
        data = decoder.feed(body)
    except FetchError:
        return b"", False
    return data, decoder.cut_short and len(data) < limit


def parse_sitemap(body: bytes, limits: Limits) -> Sitemap | None:
    """The sitemap's kind and <loc> entries (a feed's item links, a text file's URL lines), or
    None when the body is none of these."""
    data, cut_short = gunzip(body, limits.max_decompressed_size)
    limit = limits.max_sitemap_entries
    head = data[:4096]
    if head.startswith(_UTF16_BOMS):  # expat reads UTF-16 by its BOM; the sniff needs ASCII
        head = head[: len(head) // 2 * 2].decode("utf-16", "replace").encode()
    root = _ROOT.search(head)
    if root is None:
        if not _text_head(data):
            return None
        sitemap = _text(data, limit)
        sitemap.cut_short = cut_short
        return sitemap
    sitemap = Sitemap(root.group(1).decode().lower(), cut_short=cut_short)
    try:
        _read_xml(data, sitemap, limit)
    except ElementTree.ParseError:  # (its <lastmod>s not read)
        sitemap.lastmods = []
        sitemap.locs = [
            html.unescape(m.group(1).decode("utf-8", "replace")) for m in _LOC.finditer(data)
        ][:limit]
    return sitemap


def _read_xml(data: bytes, sitemap: Sitemap, limit: int) -> None:
    """Fill sitemap.locs in one streaming pass: <loc>s, or the links of a feed's items; and
    sitemap.lastmods: each entry's modification time (`_DATES`)."""
    feed = sitemap.kind in ("rss", "feed")
    in_entry = 0  # inside an RSS <item> or an Atom <entry>
    entry_loc: str | None = None  # the entry's, so far
    lastmod: float | None = None
    for event, element in ElementTree.iterparse(_Reader(data), events=("start", "end")):
        name = element.tag.rsplit("}", 1)[-1]
        if name in ("item", "entry"):
            in_entry += 1 if event == "start" else -1
        if event == "start":
            continue
        loc = None
        if not feed:
            loc = element.text if name == "loc" else None
        elif in_entry and name == "link":
            if element.tag == _ATOM + "link":  # Atom: the entry's alternate link's href
                if element.get("rel", "alternate") == "alternate":
                    loc = element.get("href")
            else:
                loc = element.text
        if name in _DATES and (in_entry or not feed):  # not a feed's own <updated>
            lastmod = _DATES[name](element.text or "")
        elif name in _ENTRIES:
            if entry_loc and lastmod is not None:
                sitemap.lastmods.append((entry_loc, lastmod))
            entry_loc = lastmod = None
        if loc and loc.strip():
            if len(sitemap.locs) >= limit:
                sitemap.truncated = True
                return
            entry_loc = loc.strip()
            sitemap.locs.append(entry_loc)
        elif name in _ENTRIES:
            element.clear()


def w3c_datetime(text: str) -> float | None:
    """A <lastmod>'s or an Atom <updated>'s time (a W3C datetime; a date alone is its midnight,
    a time without a zone UTC's), or None when it reads as none (a year or a month alone
    included)."""
    text = text.strip()
    if len(text) < 10:
        return None
    try:
        when = datetime.fromisoformat(text)
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    except (ValueError, OverflowError):
        return None


#: an entry's modification time, by element: a sitemap's <lastmod>, an Atom entry's <updated>
#: (RFC 3339: a W3C datetime), an RSS item's <pubDate> (RFC 822, as an HTTP-date)
_DATES = {"lastmod": w3c_datetime, "updated": w3c_datetime, "pubDate": http_date}
_ENTRIES = ("url", "sitemap", "item", "entry")


def _text(data: bytes, limit: int) -> Sitemap:
    """A text sitemap: its lines that are http(s) URLs (UTF-8), the others skipped."""
    sitemap = Sitemap("text")
    for line in data.removeprefix(b"\xef\xbb\xbf").splitlines():
        line = line.strip()
        if len(line) <= _TEXT_MAX_LINE and _URL_LINE.fullmatch(line):
            if len(sitemap.locs) >= limit:
                sitemap.truncated = True
                break
            sitemap.locs.append(line.decode("utf-8", "replace"))
    return sitemap


class _Reader:
    """A file-like view of bytes for iterparse (no copy)."""

    def __init__(self, data: bytes) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size < 0 else self._pos + size
        chunk = bytes(self._view[self._pos:end])
        self._pos += len(chunk)
        return chunk
