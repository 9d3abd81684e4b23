"""URL normalization, origins, registered domains and their partitions (docs/urls.md).

Parsing and resolution are done by ada (a C++ WHATWG URL parser, through its can_ada bindings):
it already lowercases the scheme and host, converts hosts to punycode, drops default ports and
removes dot segments. This module only adds what WHATWG does not do (percent-escape
normalization, fragment, query and path rules), by string operations on ada's serialization,
which keeps a call to a few microseconds. `normalize_links` resolves a page's links against its
base parsed once.
"""

from __future__ import annotations

import codecs
import functools
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import can_ada
import xxhash

from courtly.patterns import glob_to_regex

if TYPE_CHECKING:
    import tldextract

__all__ = [
    "DEFAULT_PORTS",
    "NormalizeRules",
    "Rules",
    "authority_key",
    "encode_query",
    "has_userinfo",
    "host_name_fault",
    "host_of",
    "normalize",
    "normalize_escapes",
    "normalize_links",
    "origin_of",
    "partition_key",
    "partition_of",
    "path_depth",
    "registered_domain",
    "resolve",
    "split_authority",
    "split_target",
    "split_url",
]



class NormalizeRules(Protocol):
    """What normalization reads of the [normalize] settings: config.Normalize, or `Rules`."""

    @property
    def sort_query(self) -> bool: ...
    @property
    def remove_params(self) -> Sequence[str]: ...
    @property
    def session_params(self) -> Sequence[str]: ...
    @property
    def drop_fragment(self) -> bool: ...
    @property
    def collapse_slashes(self) -> bool: ...
    @property
    def drop_index(self) -> bool: ...
    @property
    def drop_trailing_slash(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Rules:
    """A plain copy of the [normalize] settings: the page worker unpickles it without importing
    pydantic and the configuration (a tenth of a second of its start)."""

    sort_query: bool
    remove_params: tuple[str, ...]
    session_params: tuple[str, ...]
    drop_fragment: bool
    collapse_slashes: bool
    drop_index: bool
    drop_trailing_slash: bool

    @classmethod
    def of(cls, opts: NormalizeRules) -> Rules:
        """The copy of these settings."""
        return cls(opts.sort_query, tuple(opts.remove_params), tuple(opts.session_params),
                   opts.drop_fragment, opts.collapse_slashes, opts.drop_index,
                   opts.drop_trailing_slash)


@functools.cache
def _defaults() -> NormalizeRules:
    """The default [normalize] settings, loaded on first use (the page worker never asks)."""
    from courtly.config import Normalize

    return Normalize()


#: the port of an http(s) URL that names none
DEFAULT_PORTS = {"http": 80, "https": 443}
_HTTP = ("https://", "http://")
_INDEX_NAMES = frozenset({"index.html", "index.php", "default.asp", "default.aspx"})

# RFC 3986 §2.3 unreserved characters: their escapes are decoded; every other escape is upper-cased.
# A '%' that starts no escape (WHATWG leaves it raw) becomes "%25": otherwise decoding could make
# a new escape ("%%34%31" -> "%41") and normalize would not be idempotent.
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_ESCAPE_RE = re.compile(r"%(?:[0-9A-Fa-f]{2})?")
_ESCAPES: dict[str, str] = {"%": "%25"}  # "%7e" -> "~", "%3a" -> "%3A", for every case variant
for _code in range(256):
    _hex = f"{_code:02X}"
    for _esc in {
        "%" + _hex,
        "%" + _hex.lower(),
        f"%{_hex[0]}{_hex[1].lower()}",
        f"%{_hex[0].lower()}{_hex[1]}",
    }:
        _ESCAPES[_esc] = chr(_code) if chr(_code) in _UNRESERVED else "%" + _hex


#: an escape normal form changes: a '%' that starts none (or with a lower-case hex digit), an
#: unreserved character's (A-Z, a-z, 0-9, '-', '.', '_', '~'); a text without one is kept as it is
#: (one search, where the substitution calls _fix_escape for every escape: a Rust playground
#: link has a hundred, all in normal form)
_CHANGED_ESCAPE = re.compile(r"%(?![0-9A-F]{2})|%(?:[46][1-9A-F]|[57][0-9A]|3[0-9]|2[DE]|5F|7E)")


def _fix_escape(match: re.Match[str]) -> str:
    return _ESCAPES[match.group()]


def normalize_escapes(text: str) -> str:
    """Percent-escapes in normal form (robots.py compares rules and paths with it too):
    unreserved ones decoded, the others upper-cased, a '%' that starts none written "%25"."""
    if "%" not in text or _CHANGED_ESCAPE.search(text) is None:
        return text
    return _ESCAPE_RE.sub(_fix_escape, text)


def _compiles(regex: str) -> bool:
    try:
        re.compile(regex)
    except re.error:  # e.g. a reversed range "[z-a]": the glob is then matched literally
        return False
    return True


def _names(patterns: tuple[str, ...], stay_within: str) -> str:
    """Parameter-name globs as one regex alternation (a glob that is not valid: literally)."""
    return "|".join(
        glob_to_regex(p, stay_within) if _compiles(glob_to_regex(p, stay_within)) else re.escape(p)
        for p in patterns
    )


@functools.lru_cache(maxsize=32)
def _param_remover(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """One case-insensitive regex matching removable parameters (with their '&') in a query."""
    if not patterns:
        return None
    names = _names(patterns, "&=")
    return re.compile(f"(?:^|&)(?:{names})(?:=[^&]*)?(?=&|$)", re.IGNORECASE)


@functools.lru_cache(maxsize=32)
def _path_param_remover(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """One case-insensitive regex matching ";name=value" path parameters of these names
    (Java's ";jsessionid=…")."""
    if not patterns:
        return None
    return re.compile(f";(?:{_names(patterns, ';=/')})=[^/;]*", re.IGNORECASE)


def _param_name(param: str) -> str:
    return param.partition("=")[0]


def _normalize_query(query: str, sort: bool, remover: re.Pattern[str] | None) -> str:
    """Remove configured parameters, drop empty ones, then sort the rest stably by name."""
    if remover is not None:
        query = remover.sub("", query)
    if "&" in query:
        params = [p for p in query.split("&") if p]
        if sort:
            params.sort(key=_param_name)
        query = "&".join(params)
    return query


def _normalize_path(path: str, opts: NormalizeRules) -> str:
    """Apply the optional path switches until the path no longer changes (keeps idempotence)."""
    while True:
        before = path
        if opts.collapse_slashes and "//" in path:
            path = re.sub("/{2,}", "/", path)
        if opts.drop_index and path[path.rfind("/") + 1 :].lower() in _INDEX_NAMES:
            path = path[: path.rfind("/") + 1]
        if opts.drop_trailing_slash and len(path) > 1 and path.endswith("/"):
            path = path.rstrip("/") or "/"
        if path == before:
            return path


#: a byte of a query in a page's legacy encoding as the WHATWG URL parser writes it: one of the
#: special-query percent-encode set (controls, space, `"`, `#`, `<`, `>`, `'`, non-ASCII)
#: escaped, any other as it is (a Shift_JIS 本 is 0x96 0x7B: `%96{`)
_QUERY_BYTES = tuple(chr(b) if 0x20 < b < 0x7F and chr(b) not in "\"#'<>" else f"%{b:02X}"
                     for b in range(256))
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
#: encodings whose pages' queries are UTF-8 anyway (WHATWG "get an output encoding")
_UTF8_QUERIES = frozenset({"utf-8", "utf-16-le", "utf-16-be"})
_CHAR_REFS = "courtly.url-char-refs"


def _char_refs(error: UnicodeError) -> tuple[str, int]:
    """The characters the encoding lacks as WHATWG's URL parser writes them: "&#N;", escaped
    (a lone surrogate is no character: the link stays invalid)."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    chars = error.object[error.start:error.end]
    if any("\ud800" <= c <= "\udfff" for c in chars):
        raise error
    return "".join(f"%26%23{ord(c)}%3B" for c in chars), error.end


codecs.register_error(_CHAR_REFS, _char_refs)


def _encoded_run(run: re.Match[str], encoding: str) -> str:
    return "".join([_QUERY_BYTES[b] for b in run.group().encode(encoding, _CHAR_REFS)])


def encode_query(url: str, encoding: str) -> str:
    """url as written on a page in `encoding` (a Python codec), with the non-ASCII characters of
    its query in that encoding, percent-encoded, as the WHATWG URL parser writes a document's
    links (the path and fragment are always UTF-8): the query the page's server reads."""
    if encoding in _UTF8_QUERIES or url.isascii():
        return url
    start, hash_at = url.find("?"), url.find("#")  # what WHATWG's states make query and fragment
    if start < 0 or 0 <= hash_at < start:
        return url
    end = hash_at if hash_at >= 0 else len(url)
    query = url[start + 1:end]
    if query.isascii():
        return url
    try:
        query = _NON_ASCII.sub(lambda run: _encoded_run(run, encoding), query)
    except (UnicodeError, LookupError):  # a lone surrogate: left to fail as a link
        return url
    return url[:start + 1] + query + url[end:]


def _href(url: str, base: str | None) -> str | None:
    """ada's serialization of url resolved against base; None if it is not a valid URL."""
    try:
        if base is None:
            return can_ada.parse(url).href
        return (can_ada.parse(base) + url).href
    except (ValueError, TypeError):  # TypeError: a str with a lone surrogate
        return None


def resolve(url: str, base: str) -> str | None:
    """url resolved against base as a browser does, nothing normalized (a redirect's Location
    as the server wrote it); None if not a valid http(s) URL."""
    href = _href(url, base)
    return href if href is not None and href.startswith(_HTTP) else None


def normalize(url: str, base: str | None = None, opts: NormalizeRules | None = None,
              encoding: str = "utf-8") -> str | None:
    """Resolve url against base (WHATWG rules) and normalize; None if not a valid http(s) URL.
    encoding: of the page it is written on (its query is written in it: `encode_query`)."""
    if encoding != "utf-8":
        url = encode_query(url, encoding)
    href = _href(url, base)
    return None if href is None else _clean(href, _defaults() if opts is None else opts)


def normalize_links(
    urls: Sequence[str], base: str, opts: NormalizeRules | None = None, encoding: str = "utf-8"
) -> list[str | None]:
    """[normalize(url, base, opts, encoding) for url in urls], for a page's links: faster.

    The base is parsed once (can_ada: ada-url's C API parsed it again for every link, half the
    cost of resolving one), a link that needs no rewriting costs no further call, and a link to
    a place in the page itself ("#…": 38 % of the links on the Rust documentation's pages) costs
    no resolution at all.
    """
    try:
        parsed = can_ada.parse(base)
    except (ValueError, TypeError):
        return [None] * len(urls)
    opts = _defaults() if opts is None else opts
    if encoding != "utf-8":
        urls = [encode_query(url, encoding) for url in urls]
    plain = not (opts.collapse_slashes or opts.drop_index or opts.drop_trailing_slash)
    unmarked = plain and opts.drop_fragment  # a link's fragment is just cut off
    page: str | None = ""  # what "#…" resolves to (None: resolve each), worked out when first met
    out: list[str | None] = []
    for url in urls:
        if url and url[0] == "#":
            if page == "":
                page = _in_page(parsed, opts)
            if page is not None:
                out.append(page)
                continue
        try:
            href = (parsed + url).href
        except (ValueError, TypeError):
            out.append(None)
            continue
        if unmarked and "#" in href:
            href = href[:href.index("#")]  # what _clean does first (29 % of rustdoc's links)
        # _clean's own early return, without the call (2,800 instructions a link;
        # test_normalize_links_is_normalize_for_each holds the two together)
        if plain and href.startswith(_HTTP) and not (
            "#" in href or "%" in href or "?" in href or ";" in href or "@" in href
        ):
            out.append(href)
        else:
            out.append(_clean(href, opts))
    return out


def _in_page(parsed: can_ada.URL, opts: NormalizeRules) -> str | None:
    """What every link "#…" on the page resolves to (fragments dropped), or None if not so."""
    if not opts.drop_fragment:
        return None
    try:
        return _clean((parsed + "#").href, opts)  # joined, not parsed.href: ada may reserialize
    except (ValueError, TypeError):
        return None


def _clean(href: str, opts: NormalizeRules) -> str | None:
    """The rules WHATWG does not apply, on ada's serialization; None if not http(s)."""
    if not href.startswith(_HTTP):
        return None
    fragment = ""
    hash_at = href.find("#")
    if hash_at >= 0:
        if not opts.drop_fragment:
            fragment = href[hash_at:]
        href = href[:hash_at]
    href = normalize_escapes(href)
    fragment = normalize_escapes(fragment)
    path_start = href.find("/", 8)  # special URLs always have a path; the authority has no '/'
    at = href.rfind("@", 0, path_start)  # ada escapes any other '@' of a user name or password
    if at >= 0:  # credentials: never sent, never stored; the URL is the page's without them
        start = href.find("//") + 2
        href, path_start = href[:start] + href[at + 1 :], path_start - (at + 1 - start)
    path_opts = opts.collapse_slashes or opts.drop_index or opts.drop_trailing_slash
    if not path_opts and "?" not in href and ";" not in href:
        return href + fragment  # the common case: nothing more to do

    query_at = href.find("?", path_start)
    if query_at >= 0:
        path, query = href[path_start:query_at], href[query_at + 1 :]
        remover = _param_remover((*opts.remove_params, *opts.session_params))
        if query and (opts.sort_query or remover is not None):
            query = _normalize_query(query, opts.sort_query, remover)
            query_part = "?" + query if query else ""
        else:
            query_part = "?" + query
    else:
        path, query_part = href[path_start:], ""
    if ";" in path and (path_remover := _path_param_remover(tuple(opts.session_params))):
        path = path_remover.sub("", path)
    if path_opts:
        new_path = _normalize_path(path, opts)
        if new_path != path:  # a rewritten path can hold dot segments ada resolves: once more
            rewritten = href[:path_start] + new_path + query_part + fragment
            again = _href(rewritten, None)
            return rewritten if again in (None, rewritten) else _clean(again, opts)  # shorter
    return href[:path_start] + path + query_part + fragment


#: RFC 3986 appendix B: scheme, authority, path, query, fragment (a part absent: None)
_SCHEME_AUTHORITY = r"(?:([^:/?#]+):)?(?://([^/?#]*))?"
_PARTS = re.compile(_SCHEME_AUTHORITY + r"([^?#]*)(?:\?([^#]*))?(?:#(.*))?", re.S)
_TARGET = re.compile(_SCHEME_AUTHORITY + r"([^#]*)", re.S)  # the same, path and query in one
UrlParts = tuple[str | None, str | None, str, str | None, str | None]


def split_url(url: str) -> UrlParts:
    """A URL (or a reference) cut into its five parts as written, RFC 3986 appendix B: courtly's
    one URL splitter (no decoding, no checking; the path may be "")."""
    return _PARTS.match(url).groups()  # type: ignore[union-attr,return-value]  # always matches


def path_depth(url: str) -> int:
    """How many non-empty segments the URL's path has (`/a/b/` has 2)."""
    return sum(1 for segment in split_url(url)[2].split("/") if segment)


def split_target(url: str) -> tuple[str | None, str | None, str]:
    """split_url's scheme and authority, and its path and query as one string (a request line's
    target, what robots.txt rules match), fragment dropped: one regex group instead of three."""
    return _TARGET.match(url).groups()  # type: ignore[union-attr,return-value]  # always matches


def split_authority(authority: str) -> tuple[str, str]:
    """Host (an IPv6 address keeps its brackets) and port ("" if none); user info dropped."""
    hostport = authority.rpartition("@")[2]
    if hostport.startswith("["):
        end = hostport.find("]") + 1
        if end:
            return hostport[:end], hostport[end:].removeprefix(":")
    host, _, port = hostport.partition(":")
    return host, port


def has_userinfo(url: str) -> bool:
    """Whether an absolute URL names a user or a password (which `normalize` drops)."""
    href = _href(url, None)
    return href is not None and "@" in (split_url(href)[1] or "")


def host_name_fault(host: str) -> str | None:
    """What makes a host (as `host_of` gives it) a name no resolver takes (RFC 1035 §2.3.4:
    labels of 1 to 63 octets, 253 in all; one trailing dot allowed), or None. WHATWG accepts
    such names; a seed's is refused up front (an IP address has no labels to check)."""
    name = host[:-1] if host.endswith(".") else host
    if host.startswith("[") or not name.strip("0123456789."):
        return None
    labels = name.split(".")
    if "" in labels:
        return "its host name has an empty label"
    if max(map(len, labels)) > 63:
        return "its host name has a label longer than 63 characters"
    if len(name) > 253:
        return "its host name is longer than 253 characters"
    return None


def _scheme_host_port(url: str) -> tuple[str, str, str]:
    """Scheme, host and port (default filled in) of an http(s) URL; ValueError otherwise."""
    href = _href(url, None)
    if href is None:
        raise ValueError(f"not a valid URL: {url!r}")
    scheme, authority, _, _, _ = split_url(href)
    if scheme not in DEFAULT_PORTS or authority is None:
        raise ValueError(f"not an http(s) URL: {url!r}")
    host, port = split_authority(authority)
    return scheme, host, port or str(DEFAULT_PORTS[scheme])  # ada drops a default port


def authority_key(url: str) -> str:
    """The URL up to the first '/' after "scheme://": it contains the whole authority."""
    slash = url.find("/", url.find("://") + 3)
    return url[:slash] if slash > 0 else url


def origin_of(url: str) -> str:
    """Return "scheme://host:port" with the port always explicit; ValueError if not http(s)."""
    return _origin_of_prefix(authority_key(url))  # the origin depends on that prefix only


@functools.lru_cache(maxsize=4096)
def _origin_of_prefix(prefix: str) -> str:
    scheme, host, port = _scheme_host_port(prefix)
    return f"{scheme}://{host}:{port}"


def host_of(url: str) -> str:
    """Return the (lowercase, punycode) host of an http(s) URL; ValueError if not http(s)."""
    return _scheme_host_port(url)[1]


def bare_host(url: str) -> str:
    """The host of an http(s) URL as a resolver is given it: no IPv6 brackets."""
    return host_of(url).strip("[]")


@functools.cache
def _extractor() -> tldextract.TLDExtract:
    """A tldextract instance using only its bundled snapshot: no fetch, no cache directory."""
    import tldextract  # only scopes wider than a host need it; importing it costs 0.1 s

    no_urls: Sequence[str] = ()
    return tldextract.TLDExtract(
        cache_dir=None, suffix_list_urls=no_urls, fallback_to_snapshot=True
    )


@functools.lru_cache(maxsize=65536)
def registered_domain(host: str) -> str:
    """Return the registered domain of host (public-suffix aware); IPs and 'localhost' as given."""
    lookup = host.lower().rstrip(".")
    if not lookup or lookup.startswith("[") or lookup == "localhost":
        return host
    result = _extractor().extract_str(lookup)
    if not result.domain or not result.suffix:
        return host  # an IPv4 address, a bare suffix, or a name outside the public suffix list
    return f"{result.domain}.{result.suffix}"


def partition_key(origin: str) -> str:
    """What is hashed: the registered domain; IP literals and single-label hosts keep the origin.

    The public suffix list says nothing about 127.0.0.1:8001 vs 127.0.0.1:8002, which are
    different services; every origin is still crawled by one worker at a time either way.
    """
    host = bare_host(origin + "/")
    try:
        ipaddress.ip_address(host)
        return origin
    except ValueError:
        pass
    if "." not in host.rstrip("."):
        return origin
    return registered_domain(host)


def partition_of(origin: str, partitions: int) -> int:
    """The partition of an origin (docs/distributed.md): a stable hash (xxh64) of its key
    modulo the partition count."""
    return xxhash.xxh64_intdigest(partition_key(origin).encode()) % partitions
