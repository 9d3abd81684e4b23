"""A tour of the URL spaces that trap crawlers, each counted from the server's side (end to end)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import candidates, courtly
from tests.hostile_server import Conn, HostileServer, Request, link_page

TRACKERS = ["srsltid", "gbraid", "wbraid", "dclid", "_gl", "ttclid", "twclid", "li_fat_id",
            "igshid", "_hsenc", "mkt_tok", "mtm_source", "pk_campaign", "ysclid"]


async def tracked_links(conn: Conn, req: Request) -> None:
    """Every page links /p with a fresh click id or campaign tag of each tool: one page, ever
    new URLs (Google Shopping's srsltid, HubSpot's _hsenc, Marketo's mkt_tok …)."""
    fresh = os.urandom(6).hex()
    await conn.send(link_page([f"/p?{name}={fresh}" for name in TRACKERS], "one page"))


@pytest.fixture
def server() -> Iterator[HostileServer]:
    with HostileServer({"tracked": tracked_links}) as started:
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
