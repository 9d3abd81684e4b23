"""HTML → links and page directives (selectolax), with charset detection that never fails."""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field

from selectolax.lexbor import LexborHTMLParser

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-zA-Z0-9_.:-]+)""", re.I)
_HEADER_CHARSET = re.compile(r"""charset\s*=\s*["']?([a-zA-Z0-9_.:-]+)""", re.I)
_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"),
         (codecs.BOM_UTF16_BE, "utf-16-be"))

#: HTML past this many bytes is not parsed (a DOM costs 10-30 times the HTML it is built from)
MAX_PARSE_BYTES = 4 * 1024 * 1024
#: elements nested deeper than this are dropped before parsing (deep nesting is quadratic)
MAX_NESTING = 256
_MAX_ANCHOR = 1000  # characters of anchor text kept per link
#: tags never dropped: void elements, optional end tags, and what the crawler reads
_FLAT = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
    "source", "track", "wbr", "keygen", "p", "li", "dt", "dd", "tr", "td", "th", "option",
    "optgroup", "rb", "rt", "rp", "thead", "tbody", "tfoot", "colgroup", "caption", "html",
    "head", "body", "a", "title",
})
#: opening or closing tags of the elements that nest (the others are skipped by the regex engine)
_TAG = re.compile(
    r"<(/?)(?!(?:" + "|".join(sorted(_FLAT)) + r")[\s/>])([a-zA-Z][a-zA-Z0-9:-]*)[^<>]*?(/?)>",
    re.I,
)
#: pages with at most this many "<" are parsed as they are: lexbor parses even that many
#: nested elements in under 10 ms (beyond, nesting is quadratic); flattening costs as much
PARSE_AS_IS = 2000


#: a raw link as written in the page (not yet resolved): href, anchor text, rel="nofollow"
#: (a tuple: a page can have thousands, and a dataclass costs four times as much to create)
PageLink = tuple[str, str, bool]


@dataclass(slots=True)
class ParsedPage:
    """What the crawler needs from one HTML page."""

    base: str | None = None
    links: list[PageLink] = field(default_factory=list)
    canonical: str | None = None
    noindex: bool = False
    nofollow: bool = False
    title: str | None = None
    text: str = ""
    truncated: bool = False  # the body was longer than the parse limit


def _valid_codec(name: str) -> str | None:
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def decode(body: bytes, content_type: str | None) -> str:
    """Decode a page: BOM, header charset, <meta charset>, then UTF-8; never raises."""
    for bom, enc in _BOMS:
        if body.startswith(bom):
            return body[len(bom):].decode(enc, errors="replace")
    charset = None
    if content_type:
        m = _HEADER_CHARSET.search(content_type)
        charset = _valid_codec(m.group(1)) if m else None
    if charset is None:
        m2 = _META_CHARSET.search(body[:4096])
        charset = _valid_codec(m2.group(1).decode("ascii")) if m2 else None
    if charset in (None, "utf-16-le", "utf-16-be", "utf-16", "utf-32"):  # a meta can't be UTF-16
        charset = "utf-8"
    try:
        return body.decode(charset, errors="replace")
    except (LookupError, ValueError):
        return body.decode("utf-8", errors="replace")


def flatten(html: str, max_depth: int = MAX_NESTING) -> str:
    """Drop the opening and closing tags of elements nested deeper than max_depth.

    A rough tag scan (linear time), not a parser: the depth counts elements that nest; what
    the crawler reads (links, base, canonical, meta robots, title) is never dropped. A regular
    expression's sub with a callback: about 7,000 instructions a tag (as many as a loop over
    `split("<")` written by hand), so it runs only on pages with more than PARSE_AS_IS tags.
    """
    depth = 0

    def visit(m: re.Match[str]) -> str:
        nonlocal depth
        if m.group(3):
            return m.group(0)
        if m.group(1):  # a closing tag
            depth = max(0, depth - 1)
            return m.group(0) if depth < max_depth else ""
        depth += 1
        return m.group(0) if depth <= max_depth else ""

    return _TAG.sub(visit, html)


def robots_directives(value: str, token: str) -> tuple[bool, bool]:
    """(noindex, nofollow) from a meta robots / X-Robots-Tag value for our product token."""
    noindex = nofollow = False
    for part in value.split(","):
        words = part.strip().lower()
        if ":" in words:
            agent, _, words = words.partition(":")
            if agent.strip() not in (token, "*") or not words.strip():
                continue
        for word in words.split():
            if word in ("noindex", "none"):
                noindex = True
            if word in ("nofollow", "none"):
                nofollow = True
    return noindex, nofollow


def _first_href(tree: LexborHTMLParser, tag: str, rel: str | None = None) -> str | None:
    """The stripped href of the first `tag` element with an href (and `rel` among its rels)."""
    for node in tree.tags(tag):
        attrs = node.attributes
        if "href" in attrs and (rel is None or rel in (attrs.get("rel") or "").lower().split()):
            return (attrs.get("href") or "").strip()
    return None


def parse_html(
    body: bytes,
    content_type: str | None,
    token: str,
    max_links: int,
    want_text: bool = False,
    max_bytes: int = MAX_PARSE_BYTES,
    want_anchors: bool = True,
) -> ParsedPage:
    """Extract links, base href, canonical, meta robots, title and (optionally) text.

    want_anchors: the links' anchor texts ("" when not wanted: 15 µs of a page's 380 in the page
    worker, on the benchmark's pages).

    Time and memory are bounded: only the first max_bytes of the body are parsed, a page with
    more than PARSE_AS_IS tags has its elements nested deeper than MAX_NESTING flattened, at most
    max_links links are kept.
    """
    page = ParsedPage(truncated=len(body) > max_bytes)
    html = decode(body[:max_bytes], content_type)
    if html.count("<") > PARSE_AS_IS:  # enough tags to nest deeper than lexbor parses quickly
        html = flatten(html)
    tree = LexborHTMLParser(html)
    links = page.links
    # tags() walks the tree in C; a CSS selector cost more than the parse (bench/RESULTS.md)
    anchors = tree.css("a[href], area[href]") if tree.tags("area") else tree.tags("a")
    for node in anchors:  # in document order
        attrs = node.attributes
        if "href" not in attrs:
            continue
        if len(links) >= max_links:
            break
        rel = attrs.get("rel")  # usually absent
        nofollow = rel is not None and "nofollow" in rel.lower().split()
        text = node.text(strip=True)[:_MAX_ANCHOR] if want_anchors and node.tag == "a" else ""
        links.append((attrs.get("href") or "", text, nofollow))
    page.base = _first_href(tree, "base")
    page.canonical = _first_href(tree, "link", rel="canonical")
    robot_names = ("robots", token)
    for node in tree.tags("meta"):
        attrs = node.attributes
        if "content" in attrs and (attrs.get("name") or "").strip().lower() in robot_names:
            noindex, nofollow = robots_directives(attrs.get("content") or "", token)
            page.noindex |= noindex
            page.nofollow |= nofollow
    titles = tree.tags("title")
    if titles:
        page.title = titles[0].text(strip=True)[:1000]
    if want_text and tree.body is not None:
        page.text = tree.body.text(separator=" ", strip=True)
    return page
