"""Sitemaps (sitemaps.org): a <urlset> of page URLs or a <sitemapindex> of sitemaps, maybe gzipped.

Parsed with the standard library's expat (which refuses entity-expansion bombs) in a streaming
pass; a sitemap that is not well-formed XML falls back to reading its <loc> elements with a regular
expression, as search engines do. The limits are `limits.max_sitemap_entries` (the protocol's
50,000) and `limits.max_decompressed_size` (50 MiB, the protocol's 50 MB uncompressed).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from xml.etree import ElementTree

from courtly.config import Limits
from courtly.connection import Decoder
from courtly.errors import FetchError

_GZIP_MAGIC = b"\x1f\x8b"
_XML_TYPES = ("text/xml", "application/xml", "application/x-xml")
_GZIP_TYPES = ("application/gzip", "application/x-gzip", "application/octet-stream")
_LOC = re.compile(rb"<loc>\s*([^<]+?)\s*</loc>", re.I)
_ROOT = re.compile(rb"<(?:\w+:)?(urlset|sitemapindex)[\s>]", re.I)


@dataclass(slots=True)
class Sitemap:
    """What one sitemap document lists."""

    kind: str  # "urlset" or "sitemapindex"
    locs: list[str] = field(default_factory=list)
    truncated: bool = False

    @property
    def is_index(self) -> bool:
        """True for a sitemap index (its locs are sitemaps)."""
        return self.kind == "sitemapindex"


def looks_like_sitemap(url: str, content_type: str | None, body: bytes) -> bool:
    """Cheap test before parsing: an XML or gzip response, or a .xml / .xml.gz URL."""
    ctype = (content_type or "").split(";")[0].strip().lower()
    path = url.split("?")[0].lower()
    return (
        ctype in _XML_TYPES or ctype.endswith("+xml") or ctype in _GZIP_TYPES
        or path.endswith((".xml", ".xml.gz")) or body.startswith(_GZIP_MAGIC)
    ) and not ctype.startswith(("text/html", "application/xhtml"))


def gunzip(body: bytes, limit: int) -> bytes:
    """The first `limit` bytes of a gzip body, every member (a body that is not gzip is returned
    as is; one that does not decode gives b"")."""
    if not body.startswith(_GZIP_MAGIC):
        return body
    try:
        return Decoder("gzip", limit, truncate=True).feed(body)
    except FetchError:
        return b""


def parse_sitemap(body: bytes, limits: Limits) -> Sitemap | None:
    """The sitemap's kind and <loc> entries, or None when the body is not a sitemap."""
    data = gunzip(body, limits.max_decompressed_size)
    limit = limits.max_sitemap_entries
    head = _ROOT.search(data[:4096])
    if head is None:
        return None
    kind = head.group(1).decode().lower()
    sitemap = Sitemap(kind)
    try:
        for _, element in ElementTree.iterparse(_Reader(data), events=("end",)):
            if element.tag.rsplit("}", 1)[-1] == "loc" and element.text:
                if len(sitemap.locs) >= limit:
                    sitemap.truncated = True
                    break
                sitemap.locs.append(element.text.strip())
            elif element.tag.rsplit("}", 1)[-1] in ("url", "sitemap"):
                element.clear()
    except ElementTree.ParseError:
        sitemap.locs = [
            html.unescape(m.group(1).decode("utf-8", "replace")) for m in _LOC.finditer(data)
        ][:limit]
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
