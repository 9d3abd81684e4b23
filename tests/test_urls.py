"""Unit and property tests for courtly.urls (normalization, origin, registered domain).

Speed of normalize: docs/urls.md has the table (instructions a call, can_ada 3.0.0);
test_normalize_is_fast guards a generous 50 µs ceiling so that a busy CI machine never flakes.
"""

from __future__ import annotations

import string
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from courtly.config import Normalize
from courtly.urls import (
    host_of,
    normalize,
    normalize_links,
    origin_of,
    registered_domain,
    split_authority,
    split_url,
)

KEEP_ALL = Normalize(sort_query=False, remove_params=[], drop_fragment=False)


def n(url: str, base: str | None = None, /, **switches: Any) -> str | None:
    return normalize(url, base, Normalize(**switches) if switches else None)


# --- resolution ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "base", "expected"),
    [
        ("g", "http://a/b/c/d;p?q", "http://a/b/c/g"),
        ("../g", "http://a/b/c/d;p?q", "http://a/b/g"),
        ("../../../../g", "http://a/b/c/d;p?q", "http://a/g"),
        ("?y", "http://a/b/c/d;p?q", "http://a/b/c/d;p?y"),
        ("//other.example/x", "https://a/b", "https://other.example/x"),
        ("/abs", "https://a/b/c", "https://a/abs"),
        ("", "http://a/b?q#f", "http://a/b?q"),
        ("#frag", "http://a/b?q", "http://a/b?q"),
        ("  /x\t\n", "http://a/", "http://a/x"),  # WHATWG strips spaces, tabs and newlines
        ("https://other.org/p", "http://a/", "https://other.org/p"),
        ("http:foo.com", "http://example.org/foo/bar", "http://example.org/foo/foo.com"),
    ],
)
def test_relative_resolution(url: str, base: str, expected: str) -> None:
    assert n(url, base) == expected


def test_invalid_base_gives_none() -> None:
    assert n("x", "not a url") is None
    assert n("x", "mailto:a@b") is None
    assert normalize_links(["x", "/y"], "not a url") == [None, None]
    assert normalize_links(["x"], "\ud800") == [None]  # a lone surrogate: no str ada can read


# --- case, IDNA, ports, dot segments -------------------------------------------------------------


def test_lowercase_scheme_and_host_only() -> None:
    assert n("HTTP://WWW.Example.COM/Path/File.HTML?Q=Value") == (
        "http://www.example.com/Path/File.HTML?Q=Value"
    )


def test_userinfo_is_dropped() -> None:
    """A link with a user name and password was a crawl candidate of its own, the credentials
    kept in the crawl database: it is now the page's own URL (courtly sends no credentials)."""
    assert n("http://User:Pass@Example.COM/") == "http://example.com/"
    assert n("http://user@h:8080/a?b=1#c") == "http://h:8080/a?b=1"
    assert n("https://a@b@c/x") == "https://c/x"  # the last '@' ends the user info
    assert n("http://u:p%40ss@h/@name/x@y") == "http://h/@name/x@y"  # an '@' in the path stays
    assert normalize_links(["http://u:p@h/a", "//u@h/b", "/c@d"], "http://v:w@h/") == [
        "http://h/a", "http://h/b", "http://h/c@d"]


def test_idna_host_is_punycode() -> None:
    assert n("http://Bücher.de/") == "http://xn--bcher-kva.de/"
    assert n("https://пример.испытание/") == "https://xn--e1afmkfd.xn--80akhbyknj4f/"


def test_ipv4_forms_are_canonical() -> None:
    assert n("http://0x7f.1/") == "http://127.0.0.1/"
    assert n("http://[0:0::1]:8080/") == "http://[::1]:8080/"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://example.com:80/", "http://example.com/"),
        ("https://example.com:443/a", "https://example.com/a"),
        ("http://example.com:443/", "http://example.com:443/"),
        ("https://example.com:80/", "https://example.com:80/"),
        ("http://example.com:8080/", "http://example.com:8080/"),
        ("http://example.com:/", "http://example.com/"),
    ],
)
def test_default_ports_dropped(url: str, expected: str) -> None:
    assert n(url) == expected


def test_empty_path_becomes_slash() -> None:
    assert n("http://example.com") == "http://example.com/"
    assert n("http://example.com?a=1") == "http://example.com/?a=1"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://a/b/c/./../../g", "http://a/g"),
        ("http://a/./b/../b/c", "http://a/b/c"),
        ("http://a/%2e%2E/b/.%2e/c", "http://a/c"),
        ("http://a/b/..", "http://a/"),
        ("http://a/../../x", "http://a/x"),
    ],
)
def test_dot_segments_removed(url: str, expected: str) -> None:
    assert n(url) == expected


# --- percent-encoding ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://example.com/%7Euser/%41%42%43", "http://example.com/~user/ABC"),
        ("http://example.com/%7e%2d%2E%5f%30", "http://example.com/~-._0"),
        ("http://example.com/a%3ab", "http://example.com/a%3Ab"),
        ("http://example.com/a%2fb%3Fc", "http://example.com/a%2Fb%3Fc"),
        ("http://example.com/r%c3%a9sum%c3%a9", "http://example.com/r%C3%A9sum%C3%A9"),
        ("http://example.com/?%61=%7e&b=%26", "http://example.com/?a=~&b=%26"),
        ("http://example.com/a b", "http://example.com/a%20b"),
        ("http://example.com/résumé", "http://example.com/r%C3%A9sum%C3%A9"),
        # a '%' that starts no escape is encoded, so decoding can never make a new escape
        ("http://example.com/100%", "http://example.com/100%25"),
        ("http://example.com/%%34%31", "http://example.com/%2541"),
        ("http://example.com/%zz", "http://example.com/%25zz"),
    ],
)
def test_percent_encoding(url: str, expected: str) -> None:
    assert n(url) == expected


def test_escapes_in_kept_fragment_normalized() -> None:
    assert n("http://a/#%7e%3a", drop_fragment=False) == "http://a/#~%3A"


# --- fragment ------------------------------------------------------------------------------------


def test_fragment_dropped_by_default() -> None:
    assert n("http://a/b?c=1#frag") == "http://a/b?c=1"
    assert n("http://a/b#") == "http://a/b"
    assert n("http://a/#!state") == "http://a/"


def test_fragment_kept_when_switched_off() -> None:
    assert n("http://a/b?c=1#frag", drop_fragment=False) == "http://a/b?c=1#frag"
    assert n("http://a/b#", drop_fragment=False) == "http://a/b#"


# --- query ---------------------------------------------------------------------------------------


def test_query_sorted_stably_by_name() -> None:
    assert n("http://a/?c=3&b=5&a=1&b=2") == "http://a/?a=1&b=5&b=2&c=3"


def test_query_sort_keeps_case_and_values() -> None:
    assert n("http://a/?b=X&B=y&a=Z") == "http://a/?B=y&a=Z&b=X"


def test_query_sort_off_keeps_order() -> None:
    assert n("http://a/?c=3&b=5&a=1", sort_query=False) == "http://a/?c=3&b=5&a=1"


def test_query_empty_params_dropped_when_processing() -> None:
    assert n("http://a/?b=1&&a=2&") == "http://a/?a=2&b=1"
    assert n("http://a/?&") == "http://a/"


def test_empty_query_delimiter_kept() -> None:
    # RFC 3986 §6.2.3: "http://a/?" is not known to be equivalent to "http://a/"
    assert n("http://a/?") == "http://a/?"


def test_blank_values_kept_as_written() -> None:
    assert n("http://a/?b=&c&a=2") == "http://a/?a=2&b=&c"


def test_tracking_params_removed_by_default() -> None:
    url = "http://a/p?utm_source=x&id=1&UTM_Medium=y&gclid=1&fbclid=2&msclkid=3&_ga=4&yclid=5"
    assert n(url) == "http://a/p?id=1"
    assert n("http://a/p?utm_source=x") == "http://a/p"
    assert n("http://a/p?utm_source") == "http://a/p"


def test_removal_matches_whole_names_only() -> None:
    assert (
        n("http://a/?xutm_source=1&gclid2=3&my_ga=4") == "http://a/?gclid2=3&my_ga=4&xutm_source=1"
    )
    # only names are matched, never values
    assert n("http://a/?q=utm_source") == "http://a/?q=utm_source"


def test_removal_sees_decoded_names() -> None:
    assert n("http://a/?utm%5Fsource=1&a=2") == "http://a/?a=2"


def test_custom_remove_params_globs() -> None:
    opts = {"remove_params": ["session*", "ref?", "x[0-9]", "y[!a]"]}
    url = "http://a/?sessionid=1&ref1=2&ref=3&x5=4&xa=5&yb=6&ya=7&k=8"
    assert n(url, **opts) == "http://a/?k=8&ref=3&xa=5&ya=7"


def test_no_removal_when_list_empty() -> None:
    assert n("http://a/?utm_source=x", remove_params=[]) == "http://a/?utm_source=x"


def test_removal_without_sorting() -> None:
    url = "http://a/?c=1&utm_x=2&a=3"
    assert n(url, sort_query=False) == "http://a/?c=1&a=3"


def test_query_spaces_and_plus_untouched() -> None:
    assert n("http://a/?q=a b&r=c+d") == "http://a/?q=a%20b&r=c+d"


# --- optional path switches ---------------------------------------------------------------------


def test_path_switches_off_by_default() -> None:
    d = Normalize()
    assert (d.collapse_slashes, d.drop_index, d.drop_trailing_slash) == (False, False, False)
    assert n("http://a//b//index.html") == "http://a//b//index.html"
    assert n("http://a/b/") == "http://a/b/"


def test_collapse_slashes() -> None:
    assert n("http://a//b///c/", collapse_slashes=True) == "http://a/b/c/"
    assert n("http://a/b?x=//y", collapse_slashes=True) == "http://a/b?x=//y"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://a/b/index.html", "http://a/b/"),
        ("http://a/index.php?x=1", "http://a/?x=1"),
        ("http://a/b/default.asp", "http://a/b/"),
        ("http://a/b/Default.aspx", "http://a/b/"),
        ("http://a/b/index.htm", "http://a/b/index.htm"),
        ("http://a/b/myindex.html", "http://a/b/myindex.html"),
        ("http://a/?p=index.html", "http://a/?p=index.html"),
    ],
)
def test_drop_index(url: str, expected: str) -> None:
    assert n(url, drop_index=True) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://a/b/", "http://a/b"),
        ("http://a/b//", "http://a/b"),
        ("http://a/", "http://a/"),
        ("http://a/b/?x=1", "http://a/b?x=1"),
    ],
)
def test_drop_trailing_slash(url: str, expected: str) -> None:
    assert n(url, drop_trailing_slash=True) == expected


def test_all_path_switches_together() -> None:
    opts = {"collapse_slashes": True, "drop_index": True, "drop_trailing_slash": True}
    assert n("http://a//b//index.html", **opts) == "http://a/b"
    assert n("http://a/index.html/index.html", **opts) == "http://a/"


def test_path_and_query_case_never_changed() -> None:
    url = "http://a/Foo/INDEX.HTML?Q=AbC"
    assert n(url, drop_index=True) == "http://a/Foo/?Q=AbC"


# --- rejected inputs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "javascript:alert(1)",
        "mailto:someone@example.com",
        "data:text/html,hi",
        "tel:+123",
        "ftp://example.com/file",
        "ws://example.com/",
        "file:///etc/passwd",
        "",
        "   ",
        "http://",
        "http://exa mple.com/",
        "http://[v6a.ip]/",
        "http://a:99999/",
        "//example.com/no-base",
        "relative/path",
        "\ud800",
        "http://a/\ud800",
    ],
)
def test_non_http_or_invalid_gives_none(url: str) -> None:
    assert n(url) is None


def test_non_http_relative_to_http_base_gives_none() -> None:
    assert n("javascript:void(0)", "http://a/") is None
    assert n("mailto:x@y", "https://a/") is None


def test_trailing_dot_in_host_kept() -> None:
    # WHATWG keeps it, and "example.com." is a different host name for TLS and virtual hosting
    assert n("http://www.example.com./") == "http://www.example.com./"


# --- origin, host, registered domain ------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://example.org/x", "https://example.org:443"),
        ("http://example.org/x", "http://example.org:80"),
        ("http://127.0.0.1:8080/a?b", "http://127.0.0.1:8080"),
        ("HTTPS://User@Example.ORG:443/", "https://example.org:443"),
        ("https://example.org:8443/", "https://example.org:8443"),
        ("http://[::1]/", "http://[::1]:80"),
        ("http://bücher.de/", "http://xn--bcher-kva.de:80"),
    ],
)
def test_origin_of(url: str, expected: str) -> None:
    assert origin_of(url) == expected


@pytest.mark.parametrize("url", ["mailto:a@b", "ftp://a/", "nonsense", ""])
def test_origin_of_rejects_non_http(url: str) -> None:
    with pytest.raises(ValueError):
        origin_of(url)
    with pytest.raises(ValueError):
        host_of(url)


def test_host_of() -> None:
    assert host_of("https://WWW.Example.org:8443/x") == "www.example.org"
    assert host_of("http://Bücher.de/") == "xn--bcher-kva.de"
    assert host_of("http://127.0.0.1:8080/") == "127.0.0.1"


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("a.b.example.co.uk", "example.co.uk"),
        ("example.co.uk", "example.co.uk"),
        ("www.example.org", "example.org"),
        ("WWW.Example.ORG", "example.org"),
        ("www.example.org.", "example.org"),
        ("deep.sub.example.com.au", "example.com.au"),
        ("xn--bcher-kva.de", "xn--bcher-kva.de"),
        ("shop.xn--bcher-kva.de", "xn--bcher-kva.de"),
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]", "[::1]"),
        ("localhost", "localhost"),
        ("intranet", "intranet"),
        ("co.uk", "co.uk"),
        ("user.github.io", "github.io"),  # PSL private domains are not suffixes here
    ],
)
def test_registered_domain(host: str, expected: str) -> None:
    assert registered_domain(host) == expected


def test_registered_domain_is_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The extractor must work from the bundled snapshot without any network access."""
    import socket

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("network access attempted")

    import courtly.urls as urls

    urls._extractor.cache_clear()
    registered_domain.cache_clear()
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    assert registered_domain("news.bbc.co.uk") == "bbc.co.uk"


# --- defaults and speed --------------------------------------------------------------------------


def test_normalize_defaults() -> None:
    d = Normalize()
    assert d.sort_query and d.drop_fragment
    assert "utm_*" in d.remove_params


def test_normalize_is_fast() -> None:
    base = "https://www.example.org/a/b/c.html?x=1"
    links = [
        "../d/e.html?utm_source=x&b=2&a=1#frag",
        "/about/",
        "https://other.example.com/x/y?id=3",
        "page2.html",
        "#top",
        "/search?q=caf%c3%a9&page=2",
    ] * 500
    start = time.perf_counter()
    for link in links:
        normalize(link, base)
    per_call_us = (time.perf_counter() - start) / len(links) * 1e6
    assert per_call_us < 50, per_call_us


# --- properties ----------------------------------------------------------------------------------

_host_label = st.text(
    alphabet=string.ascii_letters + string.digits + "-éüß", min_size=1, max_size=8
)
_hosts = st.one_of(
    st.lists(_host_label, min_size=1, max_size=4).map(".".join),
    st.sampled_from(["127.0.0.1", "[::1]", "0x7f.1", "EXAMPLE.com", "xn--bcher-kva.de", "a.b."]),
)
_url_chars = string.ascii_letters + string.digits + "-._~%/?#&=+;:@!$'()*,[]|\\ é\t"
_segment = st.one_of(
    st.sampled_from(
        [".", "..", "%2e", "%2E%2e", "", "index.html", "default.aspx", "%7e", "%%34%31"]
    ),
    st.text(alphabet=_url_chars, max_size=8),
)
_query = st.lists(
    st.one_of(
        st.sampled_from(["utm_source=x", "gclid=1", "a=1", "b=", "c", "%61=%7E", "A=2", ""]),
        st.text(alphabet=_url_chars.replace("#", ""), max_size=8),
    ),
    max_size=5,
).map("&".join)
_urls = st.builds(
    lambda scheme, userinfo, host, port, segs, query, frag: (
        f"{scheme}://{userinfo}{host}{port}/{'/'.join(segs)}{query}{frag}"
    ),
    st.sampled_from(["http", "https", "HTTP", "hTTps"]),
    st.sampled_from(["", "user@", "u%41:p@", "%user@"]),
    _hosts,
    st.sampled_from(["", ":80", ":443", ":8080", ":"]),
    st.lists(_segment, max_size=6),
    st.one_of(st.just(""), _query.map(lambda q: "?" + q)),
    st.one_of(st.just(""), st.text(alphabet=_url_chars, max_size=8).map(lambda f: "#" + f)),
)
_options = st.builds(
    Normalize,
    sort_query=st.booleans(),
    remove_params=st.sampled_from([[], ["utm_*", "gclid"], ["a*", "?"], ["[ab]", "c"]]),
    drop_fragment=st.booleans(),
    collapse_slashes=st.booleans(),
    drop_index=st.booleans(),
    drop_trailing_slash=st.booleans(),
)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(url=_urls, opts=_options)
@example(url="http://127.0.0.1//.0/.", opts=Normalize(collapse_slashes=True))  # ada keeps "/."
def test_idempotent(url: str, opts: Normalize) -> None:
    once = normalize(url, None, opts)
    if once is not None:
        assert normalize(once, None, opts) == once
        assert once.startswith(("http://", "https://"))
        assert "#" not in once or not opts.drop_fragment


@settings(max_examples=400)
@given(link=st.one_of(_segment, _query.map(lambda q: "?" + q), _urls), opts=_options)
def test_idempotent_after_resolution(link: str, opts: Normalize) -> None:
    once = normalize(link, "https://Example.org/a/b/c?x=1", opts)
    if once is not None:
        assert normalize(once, None, opts) == once


@settings(max_examples=300)
@given(links=st.lists(st.one_of(_segment, _query.map(lambda q: "?" + q), _urls, st.text(),
                                _segment.map(lambda f: "#" + f), st.just("#")), max_size=5),
       base=_urls, opts=_options)
def test_normalize_links_is_normalize_for_each(
    links: list[str], base: str, opts: Normalize
) -> None:
    assert normalize_links(links, base, opts) == [normalize(link, base, opts) for link in links]


@settings(max_examples=800)
@given(text=st.text(), base=st.one_of(st.none(), st.text(), _urls))
def test_never_raises(text: str, base: str | None) -> None:
    result = normalize(text, base)
    assert result is None or result.startswith(("http://", "https://"))


@settings(max_examples=400)
@given(text=st.text(), encoding=st.sampled_from(
    ["cp932", "cp1252", "iso2022_jp", "gb18030", "big5hkscs", "euc_jp", "cp949", "koi8-u"]))
def test_a_legacy_pages_link_never_raises(text: str, encoding: str) -> None:
    """A link's query in its page's encoding (`encode_query`): whatever the characters (lone
    surrogates, ones the encoding lacks), an ASCII URL or None, and normalized once for all."""
    result = normalize("/p?" + text, "http://a/", None, encoding)
    assert result is None or (result.isascii() and normalize(result) == result)
    links = ["/p?" + text, "#" + text, text]
    assert normalize_links(links, "http://a/", None, encoding) == [
        normalize(link, "http://a/", None, encoding) for link in links]


@settings(max_examples=200)
@given(url=_urls)
def test_origin_agrees_with_normalize(url: str) -> None:
    once = normalize(url)
    if once is not None:
        assert origin_of(url) == origin_of(once)
        assert host_of(url) == host_of(once)


def test_invalid_glob_is_matched_literally() -> None:
    assert n("http://a/?[z-a]=1&b=2", remove_params=["[z-a]"]) == "http://a/?b=2"


@pytest.mark.parametrize(("url", "parts"), [
    ("http://www.ics.uci.edu/pub/ietf/uri/#Related",  # RFC 3986 appendix B's own example
     ("http", "www.ics.uci.edu", "/pub/ietf/uri/", None, "Related")),
    ("https://u:p@h:81/a?b=1&c#f", ("https", "u:p@h:81", "/a", "b=1&c", "f")),
    ("http://h?q", ("http", "h", "", "q", None)),
    ("http://h/p?", ("http", "h", "/p", "", None)),
    ("/a/b?c", (None, None, "/a/b", "c", None)),
    ("mailto:x@y", ("mailto", None, "x@y", None, None)),
    ("//h/a", (None, "h", "/a", None, None)),
    ("", (None, None, "", None, None)),
])
def test_one_splitter_cuts_a_url_in_five_parts_as_written(url: str, parts: tuple[Any, ...]
                                                         ) -> None:
    assert split_url(url) == parts


@pytest.mark.parametrize(("authority", "host", "port"), [
    ("h", "h", ""), ("h:8080", "h", "8080"), ("u:p@h:1", "h", "1"), ("[::1]", "[::1]", ""),
    ("[::1]:8443", "[::1]", "8443"), ("user@[2001:db8::1]:80", "[2001:db8::1]", "80"),
])
def test_an_authority_splits_into_host_and_port(authority: str, host: str, port: str) -> None:
    assert split_authority(authority) == (host, port)
