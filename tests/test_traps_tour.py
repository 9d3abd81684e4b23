"""A tour of the URL spaces that trap crawlers, each counted from the server's side (end to end)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import candidates, courtly
from tests.hostile_server import Conn, HostileServer, Request, link_page, page

TRACKERS = ["srsltid", "gbraid", "wbraid", "dclid", "_gl", "ttclid", "twclid", "li_fat_id",
            "igshid", "_hsenc", "mkt_tok", "mtm_source", "pk_campaign", "ysclid"]


async def tracked_links(conn: Conn, req: Request) -> None:
    """Every page links /p with a fresh click id or campaign tag of each tool: one page, ever
    new URLs (Google Shopping's srsltid, HubSpot's _hsenc, Marketo's mkt_tok …)."""
    fresh = os.urandom(6).hex()
    await conn.send(link_page([f"/p?{name}={fresh}" for name in TRACKERS], "one page"))


CHROME = ("Welcome to the example shop, where you find the finest products for home and garden, "
          "with free delivery on every order over fifty euros and friendly service. ") * 3
NAV = "".join(f'<a href="{h}">{h}</a>' for h in ["about/", "shop/", "contact/", "news/"])


async def soft_404(conn: Conn, req: Request) -> None:
    """A shop answering every unknown path 200 with its own page, "Sorry, /x/ was not found",
    whose navigation links are relative (no <base>): /old-page → /about/ → /about/shop/ → …"""
    text = "Our news of the day." if req.path == "/" else f"Sorry, {req.path} was not found."
    old = '<a href="/old-page">old</a>' * (req.path == "/")
    await conn.send(page(f"<html><head><title>Shop</title></head><body><p>{CHROME}</p>"
                         f"<h1>{text}</h1>{NAV}{old}</body></html>"))


@pytest.fixture
def server() -> Iterator[HostileServer]:
    with HostileServer({"tracked": tracked_links, "soft-404": soft_404}) as started:
        yield started


def test_click_ids_of_ad_and_mail_tools_make_one_url(server: HostileServer, db: Path) -> None:
    """Only utm_*, gclid, fbclid and a few more were removed: each other tool's id made every
    link a new URL, and the page was fetched about 50 times a tool before the trap budget
    stopped it."""
    run = courtly("crawl", server.url("tracked"), "--db", db, "--min-delay", "0",
                  "--progress", "off", "--max-actions", "300")
    assert run.status == 0, run.err
    assert sorted(h.path for h in server.hits_for("tracked")) == ["/", "/p"]
    assert sorted(u.rsplit("/", 1)[1] for u in candidates(db)) == ["", "p"]


def test_a_soft_404_with_relative_links_costs_tens_of_requests(
    server: HostileServer, db: Path
) -> None:
    """Every unknown path answered with the same page (its path in the text: near-duplicates,
    not copies), whose relative links nest: the links of every near-duplicate were followed,
    and the crawl went on until --max-actions (2,790 requests of 3,000 actions; 4 links make
    some 370,000 URLs before max_segment_repeats refuses them)."""
    run = courtly("crawl", server.url("soft-404"), "--db", db, "--min-delay", "0",
                  "--progress", "off", "--max-actions", "400")
    assert run.status == 0, run.err
    assert "finished: no origin has work left" in run.err
    assert len(server.hits_for("soft-404")) <= 30, len(server.hits_for("soft-404"))
    deep = [u for u, c in candidates(db).items() if u.count("/") == 5]  # /about/shop/
    assert deep
    check = courtly("check", deep[0], "--db", db)
    assert "deeper than its original: links not followed" in check.out, check.out
