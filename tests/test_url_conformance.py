"""courtly.urls.normalize against the shared conformance data (tests/conformance, vendored).

How the comparisons are made, and why they are honest:

* WHATWG (url_resolution_whatwg.json, WPT urltestdata). The expected ``href`` values are plain
  WHATWG serializations, not normalized URLs. Each case is resolved with ``KEEP_ALL`` (no query
  sorting, no parameter removal, fragment kept, path switches off), which leaves exactly two
  rules that normalize applies on top of WHATWG: percent-escape normalization and dropping a user
  name and password. The expected href gets those same rules, implemented independently below
  (``escape_normalized``, ``without_userinfo``), and the strings must be equal. Expected
  failures (``href: null``) must give None. A second check runs the default options on both
  sides: ``normalize(input, base) == normalize(href)``. The RFC 3986 §5.4 examples are checked
  against the WHATWG result recorded next to them.
* url_normalization.json, one source at a time (the sources disagree with each other):
  - RFC 3986 (http(s) cases): the RFC keeps fragments and never sorts or removes parameters, so
    the cases run with ``drop_fragment=False, remove_params=[]``; every case must match exactly.
  - w3lib ``canonicalize_url`` (sorts the query, drops the fragment unless ``keep_fragments``),
    w3lib ``safe_url_string`` and url-normalize (neither sorts nor drops anything): only http(s)
    cases whose options we can express are compared, with the matching switches. Two agreement
    rates are guarded: *exact* (our output string equals theirs, credentials dropped from theirs
    as courtly always drops them: ``without_userinfo``) and *equivalent* (our output for
    the input equals our output for their expected URL, i.e. both land on the same crawl
    candidate). They must not fall below the level measured when this test was written
    (docs/urls.md explains each difference).

Run ``python tests/test_url_conformance.py`` to print every disagreement.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from courtly.config import Normalize
from courtly.urls import normalize

KEEP_ALL = Normalize(sort_query=False, remove_params=[], drop_fragment=False)
SUPPORTED_OPTIONS = {"keep_fragments"}
HTTP_SCHEMES = ("http", "https")

# Measured when this test was written; raise them when normalize gets closer to a source.
MIN_WHATWG_PASS_RATE = 0.98
MIN_AGREEMENT: dict[tuple[str, str], tuple[int, int]] = {
    # (source, function): (exact matches, equivalent matches)
    ("w3lib", "canonicalize_url"): (63, 65),  # of 72
    ("w3lib", "safe_url_string"): (81, 166),  # of 179
    ("url-normalize", "url_normalize"): (41, 41),  # of 54
}


def conformance_dir() -> Path:
    """The vendored data (tests/conformance/README.md: where each file came from, licenses)."""
    return Path(__file__).parent / "conformance"


@cache
def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((conformance_dir() / name).read_text(encoding="utf-8"))
    return data


_UNRESERVED = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _fix(match: re.Match[str]) -> str:
    escape = match.group()
    if len(escape) == 1:
        return "%25"
    char = chr(int(escape[1:], 16))
    return char if char in _UNRESERVED else escape.upper()


def escape_normalized(href: str) -> str:
    """The percent-escape rule alone, written independently of courtly.urls."""
    return re.sub(r"%(?:[0-9A-Fa-f]{2})?", _fix, href)


def without_userinfo(href: str) -> str:
    """An absolute http(s) URL without its user name and password (courtly never keeps them),
    written independently of courtly.urls: its authority runs to the first '/', '?' or '#'."""
    return re.sub(r"^(https?://)[^/?#]*@", r"\1", href)


# --- WHATWG --------------------------------------------------------------------------------------


def whatwg_cases() -> list[dict[str, Any]]:
    cases = [
        c
        for c in load("url_resolution_whatwg.json")["cases"]
        if c["href"] is None or c["href"].startswith(("http://", "https://"))
    ]
    assert len(cases) >= 200
    return cases


def whatwg_failures() -> list[str]:
    failures = []
    for c in whatwg_cases():
        expected = None if c["href"] is None else without_userinfo(escape_normalized(c["href"]))
        got = normalize(c["input"], c["base"], KEEP_ALL)
        if got != expected:
            failures.append(
                f"{c['name']}: {c['input']!r} base={c['base']!r} -> {got!r}, expected {expected!r}"
            )
    return failures


def test_whatwg_resolution() -> None:
    cases = whatwg_cases()
    failures = whatwg_failures()
    rate = 1 - len(failures) / len(cases)
    assert rate >= MIN_WHATWG_PASS_RATE, "\n".join(failures)


def test_whatwg_expected_failures_give_none() -> None:
    failing = [c for c in whatwg_cases() if c["href"] is None]
    assert len(failing) >= 50
    assert [c["name"] for c in failing if normalize(c["input"], c["base"]) is not None] == []


def test_whatwg_with_default_options() -> None:
    mismatches = [
        c["name"]
        for c in whatwg_cases()
        if c["href"] is not None and normalize(c["input"], c["base"]) != normalize(c["href"])
    ]
    assert mismatches == []


def test_rfc3986_section_5_4_examples() -> None:
    examples = load("url_resolution_whatwg.json")["rfc3986_section_5_4"]
    assert len(examples) == 42
    for ex in examples:
        href = ex["whatwg_href"]
        expected = without_userinfo(href) if href.startswith(("http://", "https://")) else None
        assert normalize(ex["input"], ex["base"], KEEP_ALL) == expected, ex
        if ex["agree"] and expected is not None:
            assert normalize(ex["input"], ex["base"], KEEP_ALL) == ex["rfc3986_target"]


# --- url_normalization.json ----------------------------------------------------------------------


def normalization_cases(source: str, function: str | None = None) -> list[dict[str, Any]]:
    return [
        c
        for c in load("url_normalization.json")["cases"]
        if c["source"] == source
        and (function is None or c["function"] == function)
        and c.get("level") != "component"
        and c["scheme"] in HTTP_SCHEMES
        and c["input"] is not None
        and set(c.get("options") or {}) <= SUPPORTED_OPTIONS
    ]


def options_for(case: dict[str, Any]) -> Normalize:
    """Our switches that mean what the source's function (and its options) does."""
    if case["source"] == "rfc3986":
        return Normalize(drop_fragment=False, remove_params=[])
    if case["function"] == "canonicalize_url":
        keep = bool((case.get("options") or {}).get("keep_fragments"))
        return Normalize(remove_params=[], drop_fragment=not keep)
    return KEEP_ALL


@dataclass
class Agreement:
    total: int = 0
    exact: int = 0
    equivalent: int = 0
    differences: list[str] = field(default_factory=list)


def agreement(source: str, function: str) -> Agreement:
    result = Agreement()
    for c in normalization_cases(source, function):
        opts = options_for(c)
        got = normalize(c["input"], None, opts)
        expected = None if c["expected"] is None else without_userinfo(c["expected"])
        ours_for_expected = None if expected is None else normalize(expected, None, opts)
        result.total += 1
        result.exact += got == expected
        result.equivalent += got == ours_for_expected
        if got != expected:
            tag = "same key" if got == ours_for_expected else "DIFFERENT KEY"
            result.differences.append(
                f"{c['name']} [{tag}] {c['input']!r}\n    theirs {expected!r}\n    ours   {got!r}"
            )
    return result


def test_rfc3986_normalization_all_pass() -> None:
    cases = normalization_cases("rfc3986")
    assert len(cases) >= 15
    for c in cases:
        expected = without_userinfo(c["expected"])
        assert normalize(c["input"], None, options_for(c)) == expected, c["name"]
        # with the default switches both sides still land on the same crawl candidate
        assert normalize(c["input"]) == normalize(c["expected"]), c["name"]


@pytest.mark.parametrize(("source", "function"), sorted(MIN_AGREEMENT))
def test_agreement_does_not_regress(source: str, function: str) -> None:
    result = agreement(source, function)
    min_exact, min_equivalent = MIN_AGREEMENT[(source, function)]
    assert result.total > 0
    assert result.exact >= min_exact, "\n".join(result.differences)
    assert result.equivalent >= min_equivalent, "\n".join(result.differences)


def main() -> None:
    """Print the conformance figures and every disagreement."""
    cases = whatwg_cases()
    failures = whatwg_failures()
    print(f"WHATWG: {len(cases) - len(failures)}/{len(cases)} pass")
    print(*failures, sep="\n")
    rfc = normalization_cases("rfc3986")
    ok = sum(normalize(c["input"], None, options_for(c)) == without_userinfo(c["expected"])
             for c in rfc)
    print(f"RFC 3986: {ok}/{len(rfc)} exact")
    for source, function in sorted(MIN_AGREEMENT):
        r = agreement(source, function)
        print(
            f"\n{source} {function}: {r.total} cases, exact {r.exact} "
            f"({r.exact / r.total:.1%}), equivalent {r.equivalent} ({r.equivalent / r.total:.1%})"
        )
        print(*r.differences, sep="\n")


if __name__ == "__main__":
    main()
