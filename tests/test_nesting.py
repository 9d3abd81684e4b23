"""The deep-nesting guard: flatten only the pages that may need it, never a page that does."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from courtly import nesting
from courtly.parse import PARSE_AS_IS, parse_html

PIECES = ["<div>", "</div>", "<p>", "</p>", "<br/>", "<DIV >", "</x>", "<a href=x>", "</a>",
          "<b", ">", "<", "text", "<li>", "</li>", "<pre>", "<span/>", "</span>", "<é>", "<!-- ",
          " -->", "</ p>", "<p\xa0>", "</p\x1c>", "<\u212a>", "</optgroupx>", "<optgroupx>",
          "<colgroup>", "</colgroup>", "<param>", "<P>", "</P\r>", "<a\t>", "</a\n>", "<div/>",
          "</div/>", "<ul", "</ul", "<td><table>"]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=60), st.integers(1, 6))
def test_a_page_not_deeper_than_the_limit_is_what_flatten_leaves(pieces: list[str],
                                                                 depth: int) -> None:
    """deeper_than is an upper bound of flatten's depth: when it says no, flatten drops nothing."""
    html = "".join(pieces)
    if not nesting.deeper_than(html.encode(), depth):
        assert nesting.flatten(html, depth) == html


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 3))
def test_tags_counts_as_bytes_count(data: bytes, copies: int) -> None:
    page = data * (1 + copies * 1000)
    assert nesting.tags(page) == page.count(b"<")


def test_deep_pages_are_found_deep() -> None:
    assert nesting.deeper_than(b"<div>" * 300, 256)
    assert nesting.deeper_than(b"<section><b>" * 200, 256)
    assert not nesting.deeper_than(b"<div></div>" * 3000, 256)
    assert not nesting.deeper_than(b"<p><br><a href=x>y</a><img src=z>" * 3000, 256)


def real(path: str) -> bytes:
    return gzip.decompress((Path(__file__).parent / "data/near_dup" / f"{path}.gz").read_bytes())


def test_real_pages_are_parsed_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ordinary page (181 KB, 5,000 tags; two of them back to back) costs no guard at all;
    real markup past PARSE_AS_IS (three such pages) is scanned, and not flattened."""
    page = real("1.97.0-nightly/std/char/struct.DecodeUtf16.html") + real(
        "1.97.0-nightly/std/char/struct.EscapeDebug.html")
    assert 10_000 < page.count(b"<") <= PARSE_AS_IS

    def fail(*args: object) -> None:
        raise AssertionError("called")

    monkeypatch.setattr(nesting, "deeper_than", fail)
    assert len(parse_html(page, "text/html", "courtly", 5000).links) > 100
    monkeypatch.undo()
    monkeypatch.setattr(nesting, "flatten", fail)
    three = page + real("1.97.0-nightly/std/char/struct.DecodeUtf16.html")
    assert three.count(b"<") > PARSE_AS_IS
    assert len(parse_html(three, "text/html", "courtly", 5000).links) > 200
