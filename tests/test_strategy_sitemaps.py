"""Sitemap parsing for the discovery strategy (courtly.sitemaps)."""

from __future__ import annotations

import gzip

from courtly import sitemaps
from courtly.config import Limits
from courtly.sitemaps import Sitemap, gunzip, looks_like_sitemap

LIMITS = Limits()


def parse_sitemap(body: bytes, limits: Limits = LIMITS) -> Sitemap | None:
    """courtly.sitemaps.parse_sitemap with the default limits."""
    return sitemaps.parse_sitemap(body, limits)


NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'


def test_urlset_index_and_gzip() -> None:
    urlset = (f'<?xml version="1.0"?><urlset {NS}><url><loc> http://a/x </loc>'
              "<lastmod>2024-01-01</lastmod></url><url><loc>http://a/y?a=1&amp;b=2</loc></url>"
              "</urlset>").encode()
    parsed = parse_sitemap(urlset)
    assert parsed is not None and not parsed.is_index
    assert parsed.locs == ["http://a/x", "http://a/y?a=1&b=2"]
    index = f"<sitemapindex {NS}><sitemap><loc>http://a/s1.xml.gz</loc></sitemap></sitemapindex>"
    parsed_index = parse_sitemap(gzip.compress(index.encode()))
    assert parsed_index is not None and parsed_index.is_index
    assert parsed_index.locs == ["http://a/s1.xml.gz"]


def test_not_a_sitemap_malformed_limits_and_bombs() -> None:
    assert parse_sitemap(b"<html><body>hello</body></html>") is None
    assert parse_sitemap(b"\x1f\x8bnot really gzip") is None
    broken = f"<urlset {NS}><url><loc>http://a/1</loc></url><url><loc>http://a/2</loc>"
    parsed = parse_sitemap(broken.encode())  # not well-formed: <loc> read leniently
    assert parsed is not None and parsed.locs == ["http://a/1", "http://a/2"]
    many = f"<urlset {NS}>" + "".join(f"<url><loc>http://a/{i}</loc></url>" for i in range(30))
    capped = parse_sitemap((many + "</urlset>").encode(), Limits(max_sitemap_entries=10))
    assert capped is not None and capped.truncated and len(capped.locs) == 10
    bomb = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
            + "".join(f'<!ENTITY lol{i} "{"&lol%s;" % ("" if i == 1 else i - 1) * 10}">'
                      for i in range(1, 10))
            + f"]><urlset {NS}><url><loc>&lol9;</loc></url></urlset>")
    result = parse_sitemap(bomb.encode())
    assert result is None or all(len(loc) < 1000 for loc in result.locs)


def test_looks_like_sitemap_and_gunzip_limit() -> None:
    assert looks_like_sitemap("http://a/s.xml", "application/xml", b"")
    assert looks_like_sitemap("http://a/s", "text/xml; charset=utf-8", b"")
    assert looks_like_sitemap("http://a/s.xml.gz", "application/octet-stream", b"")
    assert not looks_like_sitemap("http://a/doc.pdf", "application/pdf", b"%PDF")
    assert not looks_like_sitemap("http://a/page.xml", "text/html", b"<html>")
    assert len(gunzip(gzip.compress(b"x" * 10_000), limit=100)[0]) == 100
    assert gunzip(b"plain", LIMITS.max_decompressed_size) == (b"plain", False)
    assert gunzip(b"\x1f\x8bnot gzip", LIMITS.max_decompressed_size) == (b"", False)


def test_a_gzipped_sitemap_of_several_members_is_read_whole_and_a_bomb_is_cut() -> None:
    """gunzip is the fetcher's bounded Decoder: every gzip member, never past the limit."""
    first = gzip.compress(f"<urlset {NS}><url><loc>http://a/1</loc></url>".encode())
    second = gzip.compress(b"<url><loc>http://a/2</loc></url></urlset>")
    sitemap = parse_sitemap(first + second)
    assert sitemap is not None and sitemap.locs == ["http://a/1", "http://a/2"]
    member = gzip.compress(b"\0" * (8 << 20))
    bomb = gzip.compress(b"<urlset>") + member * 10  # 80 MiB in ten members
    assert gunzip(bomb, limit=1 << 20) == (b"<urlset>" + b"\0" * ((1 << 20) - 8), False)


def test_utf16_xml_feeds_and_text_files_are_sitemaps_as_the_protocol_allows() -> None:
    utf16 = f'<?xml version="1.0" encoding="UTF-16"?><urlset {NS}><url><loc>http://a/é</loc>'
    parsed = parse_sitemap((utf16 + "</url></urlset>").encode("utf-16"))
    assert parsed is not None and parsed.locs == ["http://a/é"]
    rss = ('<rss version="2.0"><channel><link>http://a/</link><item><title>t</title>'
           "<link>http://a/post</link></item><item><link> http://a/other </link></item>"
           "</channel></rss>")
    feed = parse_sitemap(rss.encode())
    assert feed is not None and feed.label == "RSS feed"
    assert feed.locs == ["http://a/post", "http://a/other"]  # the channel's own link is not
    atom = ('<feed xmlns="http://www.w3.org/2005/Atom"><link rel="self" href="http://a/f.xml"/>'
            '<entry><link rel="edit" href="http://a/edit"/><link href="http://a/e1"/></entry>'
            '<entry><link rel="alternate" href="http://a/e2"/></entry></feed>')
    feed = parse_sitemap(atom.encode())
    assert feed is not None and feed.label == "Atom feed"
    assert feed.locs == ["http://a/e1", "http://a/e2"]
    text = b"\xef\xbb\xbfhttp://a/1\r\n\n  https://a/2  \nnot a url\nftp://a/3\nhttp://a/4"
    assert looks_like_sitemap("http://a/urls.txt", "text/plain; charset=utf-8", text)
    listed = parse_sitemap(text)
    assert listed is not None and listed.label == "text sitemap"
    assert listed.locs == ["http://a/1", "https://a/2", "http://a/4"]
    capped = parse_sitemap(b"http://a/1\nhttp://a/2\nhttp://a/3", Limits(max_sitemap_entries=2))
    assert capped is not None and capped.truncated and capped.locs == ["http://a/1", "http://a/2"]
    assert not looks_like_sitemap("http://a/notes.txt", "text/plain", b"Notes\nhttp://a/1\n")
    assert parse_sitemap(b"Notes\nhttp://a/1\n") is None


def test_lastmod_read_as_a_w3c_datetime_and_believed_only_when_it_can_be() -> None:
    """<lastmod> (url and sitemap entries, before or after <loc>): a date is its midnight UTC;
    one in the future is not believed, nor a sitemap whose entries all have the same."""
    def entry(loc: str, lastmod: str) -> str:
        return f"<url><lastmod>{lastmod}</lastmod><loc>{loc}</loc></url>" if lastmod else (
            f"<url><loc>{loc}</loc></url>")
    body = f"<urlset {NS}>" + "".join(entry(f"http://a/{i}", m) for i, m in enumerate(
        ["2024-01-02", "2024-01-02T03:04:05+01:00", "2024-01", "yesterday", "",
         "2030-01-01T00:00:00Z"])) + "</urlset>"
    parsed = parse_sitemap(body.encode())
    assert parsed is not None and len(parsed.locs) == 6
    jan2 = 1704153600.0  # 2024-01-02T00:00:00Z
    assert parsed.lastmods == [("http://a/0", jan2), ("http://a/1", jan2 + 7445),
                               ("http://a/5", 1893456000.0)]
    assert parsed.modified(now=jan2 + 86400) == parsed.lastmods[:2]
    stamped = f"<sitemapindex {NS}>" + "".join(
        f"<sitemap><loc>http://a/s{i}.xml</loc><lastmod>2024-01-02</lastmod></sitemap>"
        for i in range(3)) + "</sitemapindex>"
    every = parse_sitemap(stamped.encode())
    assert every is not None and len(every.lastmods) == 3 and every.modified(now=2e9) == []
