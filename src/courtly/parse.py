"""HTML → links and page directives (selectolax), with charset detection that never fails."""

from __future__ import annotations

import codecs
import functools
import re
from dataclasses import dataclass, field
from types import ModuleType

from selectolax.lexbor import LexborCSSSelector, LexborHTMLParser, LexborNode

from courtly.urls import NormalizeRules, normalize

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-zA-Z0-9_.:-]+)""", re.I)
_HEADER_CHARSET = re.compile(r"""charset\s*=\s*["']?([a-zA-Z0-9_.:-]+)""", re.I)
#: an XML declaration's encoding (an XHTML page's, when its header names none)
_XML_ENCODING = re.compile(rb"""<\?xml\s[^>]*?encoding\s*=\s*["']\s*([a-zA-Z0-9_.:-]+)""")
_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"),
         (codecs.BOM_UTF16_BE, "utf-16-be"))

_MAX_ANCHOR = 1000  # characters of anchor text kept per link
#: pages with at most this many "<" (an ordinary page of up to ~350 KB) are parsed as they are,
#: with no guard to pay: lexbor parses the worst markup that many tags allow (nested `<div>`,
#: `<ul><li>`, `<dl><dt>`, `<blockquote>`) in about 115 ms, what a real page of max_parse_size
#: (4 MB, 150,000 tags) costs (bench/RESULTS.md); beyond, nesting is quadratic
PARSE_AS_IS = 12000
#: a page of more bytes has its "<" counted with NumPy (nesting.tags), 8 times faster
COUNT_IN_NUMPY = 64 * 1024


#: a raw link as written in the page (not yet resolved): href, anchor text, rel="nofollow"
#: (a tuple: a page can have thousands, and a dataclass costs four times as much to create)
PageLink = tuple[str, str, bool]


@dataclass(slots=True)
class ParsedPage:
    """What the crawler needs from one HTML page."""

    base: str | None = None
    links: list[PageLink] = field(default_factory=list)
    canonical: str | None = None
    #: the first `<meta http-equiv="refresh">` that parses: its delay and URL (`refresh`)
    refresh: tuple[int, str | None] | None = None
    noindex: bool = False
    nofollow: bool = False
    title: str | None = None
    text: str = ""
    truncated: bool = False  # the body was longer than the parse limit
    #: the page's encoding (a Python codec): its links' queries are written in it
    encoding: str = "utf-8"


#: labels the WHATWG Encoding Standard knows and Python does not, and their codec
_LABELS = {
    "windows-874": "cp874", "dos-874": "cp874", "x-gbk": "gb18030", "csgb2312": "gb18030",
    "gb_2312-80": "gb18030", "iso-ir-58": "gb18030", "csiso58gb231280": "gb18030",
    "windows-949": "cp949", "x-sjis": "cp932", "windows-31j": "cp932", "x-x-big5": "big5hkscs",
    "cn-big5": "big5hkscs", "csbig5": "big5hkscs", "x-euc-jp": "euc_jp",
    "cseucpkdfmtjapanese": "euc_jp", "x-mac-roman": "mac-roman", "mac": "mac-roman",
    "csmacintosh": "mac-roman", "x-mac-cyrillic": "mac-cyrillic", "x-mac-ukrainian": "mac-cyrillic",
    "iso-8859-8-i": "iso8859-8", "csiso88598i": "iso8859-8", "logical": "iso8859-8",
    "koi8-ru": "koi8-u", "unicode-1-1-utf-8": "utf-8", "unicode11utf8": "utf-8",
    "unicode20utf8": "utf-8", "x-unicode20utf8": "utf-8", "ucs-2": "utf-16-le",
    "unicode": "utf-16-le", "csunicode": "utf-16-le", "iso-10646-ucs-2": "utf-16-le",
    "unicodefeff": "utf-16-le", "unicodefffe": "utf-16-be",
    **{f"x-cp125{i}": f"cp125{i}" for i in range(9)},
}
#: Python's codec → the one decoding as the WHATWG standard's encoding of that label does (a page
#: labelled iso-8859-1 or us-ascii is windows-1252, gb2312 is GBK, euc-kr is windows-949...)
_WHATWG = {
    "ascii": "cp1252", "iso8859-1": "cp1252", "iso8859-9": "cp1254", "tis-620": "cp874",
    "iso8859-11": "cp874", "gb2312": "gb18030", "gbk": "gb18030", "euc_kr": "cp949",
    "shift_jis": "cp932", "big5": "big5hkscs", "utf-16": "utf-16-le",
}
#: the codecs of the standard's encodings: Python's others (utf-7, utf-32, EBCDIC, rot13,
#: base64...) are labels a browser does not know
_KNOWN = frozenset({
    "utf-8", "utf-16-le", "utf-16-be", "cp866", "koi8-r", "koi8-u", "mac-roman", "mac-cyrillic",
    "cp874", "gb18030", "big5hkscs", "euc_jp", "iso2022_jp", "cp932", "cp949",
    *(f"iso8859-{i}" for i in (2, 3, 4, 5, 6, 7, 8, 10, 13, 14, 15, 16)),
    *(f"cp125{i}" for i in range(9)),
})


@functools.lru_cache(maxsize=64)  # a crawl meets a few labels (codecs.lookup: 4,000 instructions)
def _valid_codec(label: str) -> str | None:
    """The codec of an encoding label as the WHATWG Encoding Standard reads it; None: unknown."""
    label = label.strip().lower()
    try:
        name = _LABELS.get(label) or codecs.lookup(label).name
    except LookupError:
        return None
    name = _WHATWG.get(name, name)
    return name if name in _KNOWN else None


def _encoding(body: bytes, content_type: str | None) -> tuple[str, int]:
    """The page's encoding and its BOM's length, in the WHATWG order: a BOM, the header's
    charset, a `<meta charset>` in the first 4 KB (the standard's prescan reads 1 KB, Chrome
    reads on through the head), else UTF-8. A label no browser knows counts as none. An XHTML
    page (application/xhtml+xml) has its XML declaration's encoding after the header's (WHATWG's
    XML parser), then its `<meta charset>` (which a browser ignores: it shows such a page, not
    UTF-8, only when it is UTF-8)."""
    for bom, enc in _BOMS:
        if body.startswith(bom):
            return enc, len(bom)
    m = _HEADER_CHARSET.search(content_type) if content_type else None
    if m is not None and (charset := _valid_codec(m.group(1))) is not None:
        return charset, 0
    if content_type and "xhtml" in content_type.lower() and (m2 := _XML_ENCODING.match(body)):
        charset = _valid_codec(m2.group(1).decode("ascii"))
        if charset not in (None, "utf-16-le", "utf-16-be"):  # read in ASCII: not UTF-16
            return charset, 0
    m2 = _META_CHARSET.search(body, 0, 4096)  # the first 4 KB, not copied
    charset = _valid_codec(m2.group(1).decode("ascii")) if m2 else None
    if charset in (None, "utf-16-le", "utf-16-be"):  # a meta read in ASCII can't be UTF-16
        charset = "utf-8"
    return charset, 0


def utf8(body: bytes, content_type: str | None) -> tuple[bytes, str]:
    """The page in UTF-8, what lexbor parses (it replaces invalid sequences itself), and its
    encoding: a UTF-8 body as it is, without decoding and encoding it again."""
    charset, skip = _encoding(body, content_type)
    if charset == "utf-8":
        return (body[skip:] if skip else body), charset
    try:
        text = body[skip:].decode(charset, errors="replace")
    except (LookupError, ValueError):
        text = body[skip:].decode("utf-8", errors="replace")
    return text.encode(), charset


#: directives whose value follows a colon (not a user agent's name before its directives)
_VALUED_DIRECTIVES = frozenset(
    ("unavailable_after", "max-snippet", "max-image-preview", "max-video-preview"))


def robots_directives(value: str, token: str) -> tuple[bool, bool]:
    """(noindex, nofollow) from a meta robots / X-Robots-Tag value for our product token.

    `otherbot: noindex, nofollow` is otherbot's, both directives: a user agent's name is for
    the directives after it, up to the next name or the end of the header. Several headers
    come one a line (a header without a name is for every crawler)."""
    noindex = nofollow = False
    for line in value.split("\n"):
        ours = True  # no user agent named yet: for every crawler
        for part in line.split(","):
            words = part.strip().lower()
            if ":" in words:
                agent, _, rest = words.partition(":")
                agent = agent.strip()
                if agent not in _VALUED_DIRECTIVES:
                    ours, words = agent in (token, "*"), rest
            if not ours:
                continue
            for word in words.split():
                if word in ("noindex", "none"):
                    noindex = True
                if word in ("nofollow", "none"):
                    nofollow = True
    return noindex, nofollow


_DIGITS = "0123456789"
_WHITESPACE = " \t\n\f\r"  # ASCII whitespace (WHATWG Infra)


def _skip_whitespace(text: str, at: int) -> int:
    while at < len(text) and text[at] in _WHITESPACE:
        at += 1
    return at


def refresh(value: str) -> tuple[int, str | None] | None:
    """A refresh's delay in seconds and URL as browsers read a `<meta http-equiv="refresh">`
    content (WHATWG "shared declarative refresh steps": `0;URL='x'`, `0 ; url = x`, `0, x`,
    `1.5; url=x` are all refreshes to x). None: not a refresh; a URL of None: the page reloads
    itself. Its URL is not resolved yet."""
    at = _skip_whitespace(value, 0)
    start = at
    while at < len(value) and value[at] in _DIGITS:
        at += 1
    digits = value[start:at].lstrip("0")
    if at == start and value[at:at + 1] != ".":
        return None
    delay = int(digits or "0") if len(digits) <= 9 else 10**9  # int() refuses 4,300 digits
    while at < len(value) and value[at] in _DIGITS + ".":  # a fraction is ignored
        at += 1
    if at < len(value):
        if value[at] not in ";," + _WHITESPACE:
            return None
        at = _skip_whitespace(value, at)
        if value[at:at + 1] in (";", ","):
            at = _skip_whitespace(value, at + 1)
    if at == len(value):
        return delay, None
    url = value[at:]
    if url[0] in "Uu":  # "url", whitespace, "=", whitespace; else the URL is all that follows
        if url[1:3].lower() != "rl":
            return delay, url
        equals = _skip_whitespace(url, 3)
        if url[equals:equals + 1] != "=":
            return delay, url
        url = url[_skip_whitespace(url, equals + 1):]
    if url[:1] in ("'", '"'):  # a quoted URL ends at its closing quote, if any
        url = url[1:].split(url[0], 1)[0]
    return delay, url


#: a refresh (`<meta http-equiv="refresh">` or the `Refresh` header) to another URL within this
#: many seconds is a redirect (a page that says "you are being redirected" for a few seconds first
#: is one too); a longer one is a page of its own, as is a refresh of the page itself
MAX_REFRESH_DELAY = 5


def refresh_redirect(value: tuple[int, str | None] | None, base: str, url: str,
                     opts: NormalizeRules, encoding: str = "utf-8") -> tuple[str, int] | None:
    """The normalized target and delay of a refresh (`refresh`'s answer, its URL resolved
    against base; encoding: the page's) that is a redirect of url; None if it is none."""
    if value is None or value[1] is None or value[0] > MAX_REFRESH_DELAY:
        return None
    target = normalize(value[1], base, opts, encoding)
    return None if target is None or target == url else (target, value[0])


#: one link of a Link header (RFC 8288): <target> and its parameters (quoted strings whole)
_LINK_VALUE = re.compile(
    r'<([^<>]*)>((?:\s*;\s*[^\s;,="]+\s*(?:=\s*(?:"(?:[^"\\]|\\.)*"|[^\s;,"]*))?)*)')
_LINK_PARAM = re.compile(r';\s*([^\s;,="]+)\s*(?:=\s*("(?:[^"\\]|\\.)*"|[^\s;,"]*))?')


def link_canonical(value: str) -> str | None:
    """The target of the first link with relation type "canonical" in a Link header's value
    (several headers joined with ", "), not resolved yet; None if there is none. A link's
    first rel parameter counts (RFC 8288, 3.3)."""
    for link in _LINK_VALUE.finditer(value):
        for param in _LINK_PARAM.finditer(link.group(2)):
            if param.group(1).lower() == "rel":
                rel = param.group(2) or ""
                if rel.startswith('"'):
                    rel = re.sub(r"\\(.)", r"\1", rel[1:-1])
                if "canonical" in rel.lower().split():
                    return link.group(1).strip()
                break
    return None


@functools.cache
def _default_max_bytes() -> int:
    """`[limits] max_parse_size`'s default, read on first use: the page worker, which is always
    given its limit, does not load the configuration."""
    from courtly.config import Limits

    return int(Limits.model_fields["max_parse_size"].default)


@functools.cache
def _nesting() -> ModuleType:
    """courtly.nesting, imported on first use: the crawl process does not load NumPy."""
    from courtly import nesting

    return nesting


def parse_html(
    body: bytes,
    content_type: str | None,
    token: str,
    max_links: int,
    want_text: bool = False,
    max_bytes: int | None = None,
    want_anchors: bool = True,
) -> ParsedPage:
    """Extract links, base href, canonical, meta robots, title and (optionally) text.

    want_anchors: the links' anchor texts ("" when not wanted: 15 µs of a page's 380 in the page
    worker, on the benchmark's pages).

    Time and memory are bounded: only the first max_bytes of the body are parsed (a DOM costs
    10-30 times the HTML it is built from; None: `[limits] max_parse_size`'s default), a page with
    more than PARSE_AS_IS tags that may nest deeper than nesting.MAX_NESTING is flattened,
    at most max_links links are kept.
    """
    if max_bytes is None:
        max_bytes = _default_max_bytes()
    page = ParsedPage(truncated=len(body) > max_bytes)
    html, page.encoding = utf8(body[:max_bytes], content_type)
    # enough tags to nest deeper than lexbor parses quickly? A page of fewer bytes has fewer
    # (counting a 5 KB page's "<" took 25,000 instructions); a large page's are counted with
    # NumPy (bytes.count took 2 % of a 190 KB page's CPU)
    if len(html) > PARSE_AS_IS:
        tags = _nesting().tags(html) if len(html) > COUNT_IN_NUMPY else html.count(b"<")
        if tags > PARSE_AS_IS:
            html = _nesting().flattened(html)
    tree = LexborHTMLParser(html)
    # each element name read by its own tags() walk (document order): lexbor's walk by tag name
    # costs a sixth of its CSS selectors' (one find() of the eight names took 805,000
    # instructions on a Rust documentation page, the six tags() here 382,000)
    _read_links(tree, page.links, max_links, want_anchors)
    robot_names = ("robots", token)
    for node in tree.tags("meta"):
        attrs = node.attributes
        if "content" not in attrs:
            continue
        if (attrs.get("name") or "").strip().lower() in robot_names:
            noindex, nofollow = robots_directives(attrs.get("content") or "", token)
            page.noindex |= noindex
            page.nofollow |= nofollow
        elif page.refresh is None and (attrs.get("http-equiv") or "").strip().lower() == "refresh":
            page.refresh = refresh(attrs.get("content") or "")
    titles = tree.tags("title")
    page.title = titles[0].text(strip=True)[:1000] if titles else None
    page.base = next(filter(_is_str, map(_href, tree.tags("base"))), None)
    page.canonical = next(filter(_is_str, map(_canonical_href, tree.tags("link"))), None)
    if want_text:
        page.text = main_text(tree)
    return page


def _read_links(tree: LexborHTMLParser, links: list[PageLink], max_links: int,
                want_anchors: bool) -> None:
    """The page's first max_links `<a>` and `<area>` with an href, in document order."""
    nodes = tree.tags("a")
    if tree.tags("area") and (root := tree.root) is not None:  # rare: in order with the anchors
        nodes = _selector().find("a, area", root)
    for node in nodes:
        attrs = node.attributes
        if "href" not in attrs:
            continue
        if len(links) >= max_links:
            return
        rel = attrs.get("rel")  # usually absent
        nofollow = rel is not None and "nofollow" in rel.lower().split()
        text = node.text(strip=True)[:_MAX_ANCHOR] if want_anchors and node.tag == "a" else ""
        links.append((attrs.get("href") or "", text, nofollow))


def _is_str(value: str | None) -> bool:
    return value is not None


def _href(node: LexborNode) -> str | None:
    """The stripped href of an element, None if it has none."""
    attrs = node.attributes
    return (attrs.get("href") or "").strip() if "href" in attrs else None


def _canonical_href(node: LexborNode) -> str | None:
    """A `<link>`'s href if it names the canonical URL (rel="canonical"), else None."""
    rels = (node.attributes.get("rel") or "").lower().split()
    return _href(node) if "canonical" in rels else None


#: what is not a page's own content when it does not mark its main content
_CHROME = ["nav", "header", "footer", "aside", "form", "script", "style", "noscript", "template"]
_ROLE_MAIN = '[role="main" i]'


@functools.cache
def _selector() -> LexborCSSSelector:
    """One CSS selector engine, reused: selectolax's css() creates one a call (20 µs)."""
    return LexborCSSSelector()  # type: ignore[no-untyped-call]  # its stub lacks "-> None"


def main_text(tree: LexborHTMLParser) -> str:
    """The text of the page's main content, what near-duplicates are judged on (not its chrome).

    The first `<main>` element; else the `<article>` elements; else the element with role=main;
    else the body without its navigation, header, footer, asides, forms, scripts and styles (the
    tree loses them: call this last). No query first for whether the page marks anything at
    all: it cost more than it saved (main_text took 35,000 instructions more a page on the
    benchmark's pages, which mark nothing, and 63,000 more on real ones). Nor a search of the
    raw bytes: a missed `b"<nav" in html` costs 12,000-16,000 instructions on a 5 KB page, a
    tags() walk 4,800 (the role=main query 40,000, the chrome's nine walks 42,000).
    """
    body, root = tree.body, tree.root
    if body is None or root is None:
        return ""
    if mains := tree.tags("main"):
        return mains[0].text(separator=" ", strip=True)
    if articles := tree.tags("article"):
        return " ".join(node.text(separator=" ", strip=True) for node in articles)
    roles = _selector().find(_ROLE_MAIN, root)
    if roles:
        return roles[0].text(separator=" ", strip=True)
    tree.strip_tags(_CHROME)
    return body.text(separator=" ", strip=True)
