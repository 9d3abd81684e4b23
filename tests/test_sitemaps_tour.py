"""Sitemaps as a news or documentation site serves them: typed HTML, gzip cut short, entries of
other origins, and a feed's item dates as <lastmod>s."""

from __future__ import annotations

import gzip
import time
from email.utils import formatdate
from pathlib import Path

import pytest

from courtly.site import Page, html
from tests.conftest import candidates, courtly, fetched_paths, move_clock, robots

DAY = 86400.0
XML = {"Content-Type": "application/xml"}


def urlset(*urls: str) -> str:
    return "<urlset>" + "".join(f"<url><loc>{u}</loc></url>" for u in urls) + "</urlset>"


def test_a_sitemap_typed_html_a_gzip_cut_short_and_another_origins_entries(
    serve, db: Path, tmp_path: Path
) -> None:
    """A sitemap served as text/html is read as one; a .xml.gz cut short is read as far as it
    goes, and says so; another origin's URLs in scope are followed, its robots.txt naming the
    sitemap or not (strategies.md: the cross-submit rule would only hide URLs)."""
    site = serve({"a": {"/": Page(html("A", []))}, "b": {"/": Page(html("B", []))}})
    a, b = site.origins["a"], site.origins["b"]
    full = gzip.compress(urlset(*[f"{a}/gz{i}" for i in range(50)]).encode())
    site.sites["a"].update({
        "/robots.txt": robots("User-agent: *\nAllow: /\nSitemap: /index.xml\n"),
        "/index.xml": Page("<sitemapindex>" + "".join(
            f"<sitemap><loc>{a}/{name}</loc></sitemap>"
            for name in ("typed-html.xml", "cut.xml.gz", "uninvited.xml", "submitted.xml"))
            + "</sitemapindex>", headers=XML),
        "/typed-html.xml": Page('<?xml version="1.0"?>\n<?xml-stylesheet href="/s.xsl"?>\n'
                                + urlset(f"{a}/from-html"),
                                headers={"Content-Type": "text/html; charset=utf-8"}),
        "/cut.xml.gz": Page(full[: len(full) // 2], headers={"Content-Type": "application/gzip"}),
        "/uninvited.xml": Page(urlset(f"{b}/uninvited", f"{a}/own"), headers=XML),
        "/submitted.xml": Page(urlset(f"{b}/submitted"), headers=XML),
    })
    site.sites["b"]["/robots.txt"] = robots(f"User-agent: *\nSitemap: {a}/submitted.xml\n")
    config = tmp_path / "crawl.toml"
    config.write_text('[policies]\nscope = "host"\n')  # every port of 127.0.0.1 in scope
    crawl = ("crawl", "--db", db, "--min-delay", "0", "--strategy", "discovery",
             "--config", config)
    assert courtly(*crawl, b + "/").status == 0
    run = courtly(*crawl, a + "/")
    assert run.status == 0, run.err
    fetched_a, fetched_b = fetched_paths(site, "a"), fetched_paths(site, "b")
    assert "/from-html" in fetched_a and "/own" in fetched_a
    assert "/submitted" in fetched_b and "/uninvited" in fetched_b
    cut = [p for p in fetched_a if p.startswith("/gz")]
    assert 0 < len(cut) < 50
    cands = candidates(db)
    assert cands[a + "/typed-html.xml"]["detail"] == "sitemap: 1 URLs"
    assert cands[a + "/cut.xml.gz"]["detail"] == (
        f"sitemap: {len(cut)} URLs, gzip cut short: read as far as it goes")


@pytest.mark.parametrize("db", [
    "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_a_feeds_item_dates_make_its_changed_pages_due_as_a_sitemaps_lastmod_does(
    serve, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An RSS item's <pubDate> and an Atom entry's <updated> after the page's last crawl make
    it due when the feed is read (not the feed's own <updated>, nor an older date)."""
    names = ("rss-new", "rss-old", "atom-new", "atom-old")
    site = serve({"a": {"/": Page(html("Home", [f"/{n}" for n in names]))}
                  | {f"/{n}": Page(html(n, [])) for n in names}})
    a, pages = site.origins["a"], site.sites["a"]
    pages["/robots.txt"] = robots("User-agent: *\nAllow: /\nSitemap: /rss\nSitemap: /atom\n")
    pages["/rss"] = pages["/atom"] = Page(b"not yet", 404)  # errors: due again in a day
    crawl = ("crawl", "--db", db, "--min-delay", "0", "--strategy", "discovery")
    assert courtly(*crawl, a + "/").status == 0
    first = len(fetched_paths(site, "a"))
    later = time.time() + DAY
    old = "2020-01-01T00:00:00Z"
    pages["/rss"] = Page(
        f'<rss version="2.0"><channel><link>{a}/</link>'
        f"<item><link>{a}/rss-new</link><pubDate>{formatdate(later, usegmt=True)}</pubDate>"
        f"</item><item><link>{a}/rss-old</link><pubDate>Wed, 01 Jan 2020 00:00:00 GMT</pubDate>"
        "</item></channel></rss>", headers={"Content-Type": "application/rss+xml"})
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(later))
    pages["/atom"] = Page(
        f'<feed xmlns="http://www.w3.org/2005/Atom"><updated>{stamp}</updated>'
        f'<entry><link href="{a}/atom-new"/><updated>{stamp}</updated></entry>'
        f'<entry><updated>{old}</updated><link href="{a}/atom-old"/></entry></feed>',
        headers={"Content-Type": "application/atom+xml"})
    move_clock(monkeypatch, 2 * DAY)  # the feeds are due, the pages (7 days) are not
    run = courtly(*crawl)
    assert run.status == 0, run.err
    assert sorted(fetched_paths(site, "a")[first:]) == ["/atom", "/atom-new", "/rss", "/rss-new"]
