"""Traps are bounded by default: calendars, session ids, exact copies (end to end, no config)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from courtly.policy import ShapeBudget, url_shape
from tests.conftest import candidates, courtly, rows
from tests.hostile_server import (
    Conn,
    HostileServer,
    Request,
    calendar,
    link_page,
    routes,
    session_ids,
)

COPY = link_page(["/copy-child"], "the same bytes on two URLs")


async def cookieless_sessions(conn: Conn, req: Request) -> None:
    """ASP.NET's cookieless sessions: a fresh session id in the path of every link,
    /(S(25lyr4i1e9yzcvg348zpimms))/news.aspx; every URL is new, every page alike."""
    session = os.urandom(12).hex()
    await conn.send(link_page([f"/(S({session}))/news.aspx"], "the same text on every page"))


@pytest.fixture
def server() -> Iterator[HostileServer]:
    faults = {
        "calendar": calendar,
        "session-ids": session_ids,
        "cookieless": cookieless_sessions,
        "copies": routes({"/": link_page(["/a", "/b"]), "/a": COPY, "/b": COPY,
                          "/copy-child": link_page([])}),
    }
    with HostileServer(faults) as started:
        yield started


def test_a_calendar_costs_tens_of_requests_by_default(server: HostileServer, db: Path) -> None:
    run = courtly("crawl", server.url("calendar"), "--db", db, "--min-delay", "0",
                  "--progress", "off")
    assert run.status == 0, run.err
    hits = server.hits_for("calendar")
    # the shape's budget (50), plus the seed and the pages within 2 links of the first month
    assert 50 <= len(hits) <= 80, len(hits)
    cands = candidates(db)
    refused = [u for u, c in cands.items() if c["exit_code"] == "BLOCKED_BY_TRAP_BUDGET"]
    assert refused and all("/cal/" in u for u in refused)
    requested = {h.path for h in hits}
    assert not any(u[u.index("/cal/"):] in requested for u in refused)  # logged, never fetched
    detail = rows(db, "SELECT detail FROM crawl_log WHERE exit_code = 'BLOCKED_BY_TRAP_BUDGET'")
    assert detail[0]["detail"] == "trap: max_actions_per_shape 50 spent on /cal/{n}/{n}/"
    stats = courtly("stats", "--db", db)
    assert "BLOCKED_BY_TRAP_BUDGET" in stats.out
    check = courtly("check", refused[0], "--db", db)
    assert check.status == 0, check.err
    assert "/cal/{n}/{n}/" in check.out and "max_actions_per_shape" in check.out
    assert "BLOCKED_BY_TRAP_BUDGET" in check.out


def test_a_session_id_in_the_path_costs_tens_of_requests(server: HostileServer, db: Path) -> None:
    """Every link with a new session id in its path (letters and digits, not a number) was a
    new URL shape each time, so no shape's budget was ever spent: the crawl went on for ever
    (400 requests when stopped, each page a near-duplicate whose links are followed)."""
    run = courtly("crawl", server.url("cookieless"), "--db", db, "--min-delay", "0",
                  "--progress", "off", "--max-actions", "400")
    assert run.status == 0, run.err
    assert 50 <= len(server.hits_for("cookieless")) <= 80, len(server.hits_for("cookieless"))
    detail = rows(db, "SELECT detail FROM crawl_log WHERE exit_code = 'BLOCKED_BY_TRAP_BUDGET'")
    assert detail[0]["detail"] == "trap: max_actions_per_shape 50 spent on /(S({t}))/news.aspx"


def test_the_shape_budget_is_configurable(server: HostileServer, db: Path, tmp_path: Path) -> None:
    config = tmp_path / "crawl.toml"
    config.write_text("[traps]\nmax_actions_per_shape = 10\n")
    run = courtly("crawl", server.url("calendar"), "--db", db, "--min-delay", "0",
                  "--config", config, "--progress", "off")
    assert run.status == 0, run.err
    assert 10 <= len(server.hits_for("calendar")) <= 40


def test_session_ids_are_removed_by_default(server: HostileServer, db: Path) -> None:
    run = courtly("crawl", server.url("session-ids"), "--db", db, "--min-delay", "0",
                  "--progress", "off")
    assert run.status == 0, run.err
    assert sorted(h.path for h in server.hits_for("session-ids")) == [
        "/", "/about", "/cart?item=1"
    ]
    assert not any("sid" in u.lower() for u in candidates(db))


def test_links_of_an_exact_duplicate_are_not_followed_by_default(
    server: HostileServer, db: Path
) -> None:
    run = courtly("crawl", server.url("copies"), "--db", db, "--min-delay", "0",
                  "--progress", "off")
    assert run.status == 0, run.err
    codes = sorted(c["exit_code"] for u, c in candidates(db).items() if u.endswith(("/a", "/b")))
    assert codes == ["DUPLICATE_CONTENT", "OK"]
    # the original's link is followed once; the copy adds nothing
    assert [h.path for h in server.hits_for("copies")].count("/copy-child") == 1


def test_url_shape_abstracts_digits_dates_and_query_values() -> None:
    assert url_shape("http://a/cal/2026/11/?view=week") == "/cal/{n}/{n}/?view={v}"
    assert url_shape("http://a/news/2026-11-26/storm") == "/news/{n}-{n}-{n}/storm"
    assert url_shape("http://a/item?id=12345&p=2") == "/item?id={v}&p={v}"
    assert url_shape("http://a/about") == "/about"
    assert url_shape("http://a/(S(25lyr4i1e9yzcvg348zpimms))/a") == "/(S({t}))/a"  # a token
    assert url_shape("http://a/commit/3f2a9c0d1e2b4a5c6d7e8f90") == "/commit/{t}"
    assert url_shape("http://a/internationalization") == "/internationalization"  # a word
    assert url_shape("http://a/p/123456789012345/b2") == "/p/{n}/b{n}"
    budget = ShapeBudget(3, slack=1)
    catalogue = [budget.spend(f"http://a/p/{i}", 2 + i % 2).allowed for i in range(100)]
    assert all(catalogue)
    deeper = [budget.spend(f"http://a/p/{i}", 4 + i).allowed for i in range(5)]  # ever deeper
    assert deeper == [True, True, True, False, False]
    assert budget.spend("http://a/p/7", 3).allowed  # within the slack: still free
    assert budget.spend("http://a/q/1", 9).allowed  # another shape has its own budget
    assert all(ShapeBudget(0).spend(f"http://a/p/{i}", i).allowed for i in range(100))  # 0: off
