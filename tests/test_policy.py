"""Scope, crawl policies (do_not_crawl, allow/deny, url_query_parameters) and trap guards."""

from __future__ import annotations

from typing import Any

import pytest

from courtly import policy as policy_module
from courtly.config import ConfigError, Policies, Traps, load_config
from courtly.policy import ALLOWED, Policy, Verdict

SEEDS = ["https://www.example.org/", "http://blog.example.co.uk:8080/start"]
NO_TRAPS = Traps(
    max_url_length=0, max_path_depth=0, max_segment_repeats=0, max_query_params=0, max_depth=0
)


def make(seeds: list[str] | None = None, traps: Traps | None = None, **policies: Any) -> Policy:
    return Policy(Policies(**policies), traps or NO_TRAPS, SEEDS if seeds is None else seeds)


# --- scope -----------------------------------------------------------------------------------


def test_scope_origin() -> None:
    p = make(scope="origin")
    assert p.in_scope("https://www.example.org/a")
    assert p.in_scope("https://www.example.org:443/a")  # default port is the same origin
    assert p.in_scope("http://blog.example.co.uk:8080/x?y=1")
    assert not p.in_scope("http://www.example.org/a")  # other scheme
    assert not p.in_scope("https://www.example.org:8443/a")  # other port
    assert not p.in_scope("https://example.org/")
    assert not p.in_scope("http://blog.example.co.uk/")  # port 80, not 8080
    assert p.origin_for("https://www.example.org/a") == "https://www.example.org:443"
    assert p.origin_for("https://example.org/") is None
    assert p.check("https://example.org/", 0) == Verdict(False, "scope: not in origin")


def test_scope_host() -> None:
    p = make(scope="host")
    assert p.in_scope("http://www.example.org/a")
    assert p.in_scope("https://www.example.org:8443/a")
    assert p.in_scope("https://blog.example.co.uk/")
    assert not p.in_scope("https://sub.www.example.org/")
    assert not p.in_scope("https://example.org/")
    # wider scopes: every origin discovered in scope gets its own crawler
    assert p.origin_for("http://www.example.org/a") == "http://www.example.org:80"
    assert p.check("https://example.org/", 0).rule == "scope: not in host"


def test_scope_subdomains() -> None:
    p = make(scope="subdomains")
    assert p.in_scope("https://www.example.org/")
    assert p.in_scope("https://a.b.www.example.org/")
    assert p.in_scope("https://x.blog.example.co.uk/")
    assert not p.in_scope("https://example.org/")  # parent, not subdomain
    assert not p.in_scope("https://wwwexample.org/")
    assert not p.in_scope("https://www.example.org.evil.com/")
    assert p.origin_for("https://a.www.example.org/") == "https://a.www.example.org:443"


def test_scope_domain_is_public_suffix_aware() -> None:
    p = make(scope="domain")
    assert p.in_scope("https://example.org/")
    assert p.in_scope("https://cdn.example.org/")
    assert p.in_scope("https://example.co.uk/")  # registered domain of blog.example.co.uk
    assert p.in_scope("https://shop.example.co.uk/")
    assert not p.in_scope("https://other.co.uk/")  # same public suffix, other domain
    assert not p.in_scope("https://example.com/")
    assert p.check("https://other.co.uk/", 0).rule == "scope: not in domain"


def test_scope_rejects_garbage_and_caches_per_authority() -> None:
    p = make(scope="origin")
    assert not p.in_scope("ftp://www.example.org/")
    assert not p.in_scope("not a url")
    assert p.origin_for("mailto:someone@example.org") is None
    for i in range(3):
        assert p.in_scope(f"https://www.example.org/page{i}")
    assert "https://www.example.org" in p._scope_cache


def test_scope_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_module, "_SCOPE_CACHE_SIZE", 10)
    p = make(scope="domain")
    for i in range(50):
        assert p.in_scope(f"https://h{i}.example.org/")
    assert len(p._scope_cache) <= 10


# --- patterns --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "url", "hit"),
    [
        # plain prefix against the full URL
        ("https://www.example.org/private", "https://www.example.org/private/x", True),
        ("https://www.example.org/private", "https://www.example.org/privately", True),
        ("https://www.example.org/private", "https://www.example.org/public", False),
        # "/" prefix against path+query
        ("/private/", "https://www.example.org/private/x", True),
        ("/private/", "https://www.example.org/a/private/x", False),
        ("/search?q=", "https://www.example.org/search?q=x", True),
        ("/a.b", "https://www.example.org/aXb", False),  # literal, no regex meaning
        # glob: the whole URL / whole path+query
        ("glob:*.pdf", "https://www.example.org/docs/a.pdf", True),
        ("glob:*.pdf", "https://www.example.org/docs/a.pdf?dl=1", False),
        ("glob:/docs/*.pdf", "https://www.example.org/docs/x/a.pdf", True),
        ("glob:/docs/*.pdf", "https://www.example.org/other/docs/a.pdf", False),
        ("glob:/p?ge", "https://www.example.org/page", True),
        ("glob:/p?ge", "https://www.example.org/paage", False),
        ("glob:/v[0-9]/*", "https://www.example.org/v2/x", True),
        ("glob:/v[!0-9]/*", "https://www.example.org/v2/x", False),
        ("glob:/v[!0-9]/*", "https://www.example.org/vx/x", True),
        ("glob:https://*.example.org/*", "https://www.example.org/x", True),
        # re: searched anywhere in the URL ...
        ("re:[?&]sessionid=", "https://www.example.org/a?b=1&sessionid=2", True),
        ("re:[?&]sessionid=", "https://www.example.org/sessionid=2", False),
        ("re:^http://", "https://www.example.org/", False),
        ("re:\\.(jpe?g|png)$", "https://www.example.org/i/x.JPG", False),  # case-sensitive
        ("re:(?i)\\.(jpe?g|png)$", "https://www.example.org/i/x.JPG", True),
        # ... or matched at the start of the path when it begins with "/"
        ("re:/item/\\d+$", "https://www.example.org/item/42", True),
        ("re:/item/\\d+$", "https://www.example.org/x/item/42", False),
        ("re:/item/\\d+$", "https://www.example.org/item/42/more", False),
    ],
)
def test_pattern_kinds(pattern: str, url: str, hit: bool) -> None:
    p = make(do_not_crawl=[pattern])
    expected = Verdict(False, f"do_not_crawl: {pattern}") if hit else ALLOWED
    assert p.check(url, 0) == expected


def test_first_matching_rule_is_reported() -> None:
    p = make(do_not_crawl=["re:/a", "/a/b", "glob:*"])
    assert p.check("https://www.example.org/a/b", 0).rule == "do_not_crawl: re:/a"
    assert p.check("https://www.example.org/z", 0).rule == "do_not_crawl: glob:*"


@pytest.mark.parametrize("bad", ["", "re:", "glob:", "re:(unclosed", "re:a{2,1}", "re:a)|(b"])
def test_invalid_patterns_are_config_errors(bad: str) -> None:
    with pytest.raises(ValueError, match="pattern"):
        Policies(deny=[bad])


def test_invalid_pattern_in_toml(tmp_path: Any) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[policies]\ndo_not_crawl = ["re:("]\n')
    with pytest.raises(ConfigError, match=r"policies\.do_not_crawl"):
        load_config(str(path), {})


# --- allow / deny ----------------------------------------------------------------------------


def test_allow_list_is_a_white_list() -> None:
    p = make(allow=["/docs/", "glob:*.html"])
    assert p.check("https://www.example.org/docs/x", 0) == ALLOWED
    assert p.check("https://www.example.org/a/b.html", 0) == ALLOWED
    assert p.check("https://www.example.org/a/b.pdf", 0) == Verdict(
        False, "allow: no allow pattern matches"
    )


def test_deny_wins_over_allow_and_do_not_crawl_comes_first() -> None:
    p = make(
        do_not_crawl=["/docs/secret/"],
        allow=["/docs/"],
        deny=["glob:/docs/*.pdf", "/docs/secret/"],
    )
    assert p.check("https://www.example.org/docs/a.html", 0) == ALLOWED
    assert p.check("https://www.example.org/docs/a.pdf", 0).rule == "deny: glob:/docs/*.pdf"
    assert p.check("https://www.example.org/docs/secret/x", 0).rule == (
        "do_not_crawl: /docs/secret/"
    )
    assert p.check("https://www.example.org/other", 0).rule == "allow: no allow pattern matches"


def test_no_patterns_allows_everything_in_scope() -> None:
    assert make().check("https://www.example.org/anything?at=all", 5) == ALLOWED


# --- url_query_parameters --------------------------------------------------------------------

QUERY_RULES = [
    {"path_prefix": "/search", "allow": [["q"], ["q", "page"]]},
    {"path_prefix": "/search/advanced", "allow": [["q", "lang"]]},
    {"path_prefix": "/static", "allow": []},
]


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://www.example.org/search?q=a", True),
        ("https://www.example.org/search?page=2&q=a", True),  # order does not matter
        ("https://www.example.org/search?q=a&q=b", True),  # a set of names: duplicates fold
        ("https://www.example.org/search?q=a&page=2&sort=up", False),
        ("https://www.example.org/search?page=2", False),
        ("https://www.example.org/search", True),  # no query: nothing to judge
        ("https://www.example.org/search/advanced?q=a&lang=en", True),  # its own rule
        ("https://www.example.org/search/advanced?q=a", True),  # /search also covers it
        ("https://www.example.org/search/advanced?lang=en", False),
        ("https://www.example.org/static/x.css?v=3", False),  # covered, nothing allowed
        ("https://www.example.org/other?anything=1&goes=2", True),  # under no prefix
        ("https://www.example.org/search?%71=a", True),  # names are percent-decoded
    ],
)
def test_url_query_parameters(url: str, allowed: bool) -> None:
    p = make(url_query_parameters=QUERY_RULES)
    assert p.check(url, 0).allowed is allowed


def test_url_query_parameters_reason_and_root_prefix() -> None:
    p = make(url_query_parameters=QUERY_RULES)
    assert p.check("https://www.example.org/search?sort=1", 0) == Verdict(
        False, "url_query_parameters: /search allows {page,q}, {q}"
    )
    assert p.check("https://www.example.org/static/a?v=1", 0).rule == (
        "url_query_parameters: /static allows no parameters"
    )
    root = make(url_query_parameters=[{"path_prefix": "/", "allow": [["id"]]}])
    assert root.check("https://www.example.org/any/where?id=1", 0) == ALLOWED
    assert root.check("https://www.example.org/any/where?x=1", 0).rule == (
        "url_query_parameters: / allows {id}"
    )


def test_url_query_parameters_config_validation() -> None:
    with pytest.raises(ValueError, match="path_prefix"):
        Policies(url_query_parameters=[{"path_prefix": "search", "allow": [["q"]]}])
    with pytest.raises(ValueError, match="extra"):
        Policies(url_query_parameters=[{"path_prefix": "/s", "alow": [["q"]]}])


# --- trap guards -----------------------------------------------------------------------------


def test_trap_max_url_length() -> None:
    p = make(traps=Traps(max_url_length=60))
    ok = "https://www.example.org/" + "a" * 36
    assert len(ok) == 60
    assert p.check(ok, 0) == ALLOWED
    assert p.check(ok + "b", 0) == Verdict(False, "trap: max_url_length 60")


def test_trap_max_path_depth() -> None:
    p = make(traps=Traps(max_path_depth=3, max_segment_repeats=0))
    assert p.check("https://www.example.org/a/b/c/", 0) == ALLOWED
    assert p.check("https://www.example.org/a/b/c/d", 0) == Verdict(False, "trap: max_path_depth 3")


def test_trap_max_segment_repeats() -> None:
    p = make(traps=Traps(max_segment_repeats=2, max_path_depth=0))
    assert p.check("https://www.example.org/a/b/a/b/c", 0) == ALLOWED
    assert p.check("https://www.example.org/a/b/a/c/a", 0) == Verdict(
        False, "trap: max_segment_repeats 2"
    )
    assert p.check("https://www.example.org/cal/2024/cal/2024/cal/2024", 0).rule == (
        "trap: max_segment_repeats 2"
    )


def test_trap_max_query_params() -> None:
    p = make(traps=Traps(max_query_params=3))
    assert p.check("https://www.example.org/?a=1&b=2&c=3", 0) == ALLOWED
    assert p.check("https://www.example.org/?a=1&b=2&c=3&a=4", 0) == Verdict(
        False, "trap: max_query_params 3"
    )


def test_trap_max_depth() -> None:
    p = make(traps=Traps(max_depth=2))
    assert p.check("https://www.example.org/x", 2) == ALLOWED
    assert p.check("https://www.example.org/x", 3) == Verdict(False, "trap: max_depth 2")


def test_traps_zero_disables_and_default_limits() -> None:
    long_deep = (
        "https://www.example.org/"
        + "/".join(["x"] * 200)
        + "?"
        + "&".join(f"p{i}=1" for i in range(100))
    )
    assert make(traps=NO_TRAPS).check(long_deep, 10_000) == ALLOWED
    defaults = make(traps=Traps())
    assert defaults.check(long_deep, 0).allowed is False


def test_check_order() -> None:
    traps = Traps(max_url_length=80, max_depth=1, max_query_params=1)
    p = make(traps=traps, do_not_crawl=["/x"], url_query_parameters=[{"path_prefix": "/q"}])
    long_x = "https://www.example.org/x" + "y" * 80
    assert p.check("https://example.org/x", 5).rule == "scope: not in origin"
    assert p.check(long_x, 5).rule == "trap: max_url_length 80"
    assert p.check("https://www.example.org/x?a=1&b=2", 5).rule == "do_not_crawl: /x"
    assert p.check("https://www.example.org/q?a=1&b=2", 5).rule.startswith("url_query_")
    assert p.check("https://www.example.org/z?a=1&b=2", 5).rule == "trap: max_query_params 1"
    assert p.check("https://www.example.org/z?a=1", 5).rule == "trap: max_depth 1"


# --- many patterns ---------------------------------------------------------------------------


def _many_patterns(n: int) -> list[str]:
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(f"/section{i}/")
        elif kind == 1:
            out.append(f"https://www.example.org/full{i}")
        elif kind == 2:
            out.append(f"glob:/files{i}/*.pdf")
        else:
            out.append(f"re:[?&]token{i}=\\d+")
    return out


@pytest.mark.parametrize("n", [10_000, 2_000])
def test_ten_thousand_patterns(n: int) -> None:
    patterns = _many_patterns(n)
    p = make(do_not_crawl=patterns[: n // 2], deny=patterns[n // 2 :])
    # n=10,000 puts 5,000 globs/regexes above SET_LIMIT (a FilteredRE2 beside the set);
    # n=2,000 puts 1,000 of them in one RE2 set: both paths must agree
    half = n // 2
    cases = {
        "https://www.example.org/section0/x": "do_not_crawl: /section0/",
        f"https://www.example.org/section{half - 4}/": f"do_not_crawl: /section{half - 4}/",
        "https://www.example.org/full1": "do_not_crawl: https://www.example.org/full1",
        "https://www.example.org/full5/deeper": "do_not_crawl: https://www.example.org/full5",
        "https://www.example.org/files2/a/b.pdf": "do_not_crawl: glob:/files2/*.pdf",
        f"https://www.example.org/files{n - 2}/x.pdf": f"deny: glob:/files{n - 2}/*.pdf",
        f"https://www.example.org/?a=1&token{n - 1}=42": f"deny: re:[?&]token{n - 1}=\\d+",
        f"https://www.example.org/section{half}/": f"deny: /section{half}/",
    }
    for url, rule in cases.items():
        assert p.check(url, 0) == Verdict(False, rule), url
    for url in [
        "https://www.example.org/section1/x",  # index 1 is a full-URL prefix, not a section
        "https://www.example.org/files2/a/b.pdf.html",
        f"https://www.example.org/?token{n - 1}=x",
        f"https://www.example.org/files{n + 2}/x.pdf",
        "https://www.example.org/",
    ]:
        assert p.check(url, 0) == ALLOWED, url


def test_matcher_agrees_with_naive_loop() -> None:
    import re

    patterns = [*_many_patterns(3000), "re:/a+b", "glob:*x?z*", "/"]
    matcher = policy_module._Matcher(patterns)
    regexes = [re.compile(policy_module.compile_pattern(p)[0]) for p in patterns]
    urls = [
        "https://www.example.org/",
        "https://www.example.org/section8/",
        "https://www.example.org/files6/q.pdf",
        "https://www.example.org/aaab?token7=1&token11=2",
        "https://www.example.org/full5xyz",
    ]
    for url in urls:
        expected = sorted(i for i, r in enumerate(regexes) if r.match(url))
        assert sorted(matcher.match(url)) == expected, url
