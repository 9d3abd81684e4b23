"""A tour of the URL spaces that trap crawlers, each counted from the server's side (end to end)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

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


FACETS = {"brand": ["acme", "bolt", "core", "dune"], "color": ["red", "blue", "green", "grey"],
          "material": ["wood", "steel", "glass", "stone"], "size": ["s", "m", "l", "xl"],
          "sort": ["price", "name", "new"]}


async def faceted(conn: Conn, req: Request) -> None:
    """A shop's search: every page links each filter changed by one step (set, changed or
    removed), so the 5 facets make 2,500 URLs of 19 values."""
    chosen = dict(parse_qsl(urlsplit(req.path).query))
    links = []
    for name, values in FACETS.items():
        for value in [*values, None]:
            other = {k: v for k, v in chosen.items() if k != name} | (
                {} if value is None else {name: value})
            links.append("/shop?" + urlencode(sorted(other.items())) if other else "/shop")
    await conn.send(link_page(links, f"the products of {req.path}"))


async def articles(conn: Conn, req: Request) -> None:
    """A Joomla site: every article is /index.php?option=com_content&view=article&id=N."""
    await conn.send(link_page([f"/index.php?option=com_content&view=article&id={n}"
                               for n in range(150)], f"the article at {req.path}"))


@pytest.fixture
def server() -> Iterator[HostileServer]:
    with HostileServer({"tracked": tracked_links, "soft-404": soft_404, "faceted": faceted,
                        "articles": articles}) as started:
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


def test_a_faceted_search_costs_its_values_and_a_hundred_recombinations(
    server: HostileServer, db: Path
) -> None:
    """Five filters of a shop's search, each page linking every one-step change: each set of
    filters was a URL shape of its own found near the top, so no budget applied and the crawl
    went on through all 2,500 combinations of 19 values. Now a path's URLs that only recombine
    query values already seen there cost at most traps.max_query_recombinations (100)."""
    run = courtly("crawl", server.url("faceted") + "shop", "--db", db, "--min-delay", "0",
                  "--progress", "off", "--max-actions", "800")
    assert run.status == 0, run.err
    assert "finished: no origin has work left" in run.err
    assert len(server.hits_for("faceted")) <= 250, len(server.hits_for("faceted"))
    refused = [(url, c["detail"]) for url, c in candidates(db).items()
               if c["exit_code"] == "BLOCKED_BY_TRAP_BUDGET"]
    assert refused and refused[0][1].startswith(
        "trap: max_query_recombinations 100 spent on /shop?brand={v}&color={v}&material={v}")
    check = courtly("check", refused[0][0], "--db", db)
    assert "(traps.max_query_recombinations), spent when this URL's turn came" in check.out


def test_a_catalogue_of_ids_under_one_path_is_crawled_whole(server: HostileServer, db: Path
                                                            ) -> None:
    run = courtly("crawl", server.url("articles") + "index.php", "--db", db, "--min-delay", "0",
                  "--progress", "off")
    assert run.status == 0, run.err
    fetched = {dict(parse_qsl(urlsplit(h.path).query)).get("id")
               for h in server.hits_for("articles")}
    assert fetched >= {str(n) for n in range(150)}, run.err
    assert "BLOCKED_BY_TRAP_BUDGET" not in run.err
