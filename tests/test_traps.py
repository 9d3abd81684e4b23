"""Traps are bounded by default: calendars, session ids, exact copies (end to end, no config)."""

from __future__ import annotations

import base64
import itertools
import os
import random
import string
from collections.abc import Iterator
from pathlib import Path

import pytest

from courtly.policy import ShapeBudget, url_shape
from tests.conftest import candidates, courtly, rows
from tests.hostile_server import (
    Conn,
    Fault,
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


_LETTERS = random.Random(7)  # the same letter tokens on every run of the tests


async def letter_tokens(conn: Conn, req: Request) -> None:
    """A session token of letters only, mixed case, in the path of every link:
    /s/AbCdEfGhIjKlMnOpQrStUv/page, a fresh one each page."""
    token = "".join(_LETTERS.choice(string.ascii_letters) for _ in range(22))
    await conn.send(link_page([f"/s/{token}/page"], "the same text on every page"))


async def base64url_tokens(conn: Conn, req: Request) -> None:
    """A base64url session token ('-' and '_' in it) in the path of every link:
    /sess/Zm9vYmFyYmF6cXV4cXV1eA-_/x, a fresh one each page."""
    token = base64.urlsafe_b64encode(os.urandom(18)).decode()
    await conn.send(link_page([f"/sess/{token}/x"], "the same text on every page"))


def word_chain(count: int) -> Fault:
    """A wiki and a blog of long names, each page linking the next, so each is found one link
    deeper than the last: /wiki/GettingStartedWith, /blog/3/getting-started-with-courtly-…"""
    words = ["Getting", "Started", "With", "Courtly", "Documentation", "Installation",
             "Configuration", "Reference", "Internationalization", "Politeness"]
    names = ["".join(three) for three in itertools.permutations(words, 3)][::7][:count]
    posts = [f"/blog/{i}/" + "-".join(w.lower() for w in words[i % 10:] + words[:i % 10])
             for i in range(count)]
    table: dict[str, bytes | Fault] = {"/": link_page([f"/wiki/{names[0]}", posts[0]])}
    for i in range(count):
        table[f"/wiki/{names[i]}"] = link_page([f"/wiki/{n}" for n in names[i + 1 : i + 2]])
        table[posts[i]] = link_page(posts[i + 1 : i + 2])
    return routes(table)


@pytest.fixture
def server() -> Iterator[HostileServer]:
    faults = {
        "calendar": calendar,
        "session-ids": session_ids,
        "cookieless": cookieless_sessions,
        "letters": letter_tokens,
        "base64url": base64url_tokens,
        "words": word_chain(12),
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


@pytest.mark.parametrize("name", ["letters", "base64url"])
def test_a_letter_or_base64url_token_in_the_path_costs_tens_of_requests(
    name: str, server: HostileServer, db: Path
) -> None:
    """A session token of letters only (/s/AbCdEfGhIjKlMnOpQrStUv/page) or base64url (with '-'
    and '_') escaped the token shape (letters and digits, both): each page's link was a new
    shape and the trap went on until --max-actions (400 requests)."""
    run = courtly("crawl", server.url(name), "--db", db, "--min-delay", "0",
                  "--progress", "off", "--max-actions", "400")
    assert run.status == 0, run.err
    assert 50 <= len(server.hits_for(name)) <= 80, len(server.hits_for(name))
    spent = rows(db, "SELECT detail FROM crawl_log WHERE exit_code = 'BLOCKED_BY_TRAP_BUDGET'")
    shape = {"letters": "/s/{t}/page", "base64url": "/sess/{t}/x"}[name]
    assert spent[0]["detail"] == f"trap: max_actions_per_shape 50 spent on {shape}"


def test_long_words_in_paths_are_no_tokens(server: HostileServer, db: Path,
                                          tmp_path: Path) -> None:
    """A wiki's CamelCase names and a blog's long slugs, each page found one link deeper than
    the last, are not one shape: with a budget of 3 a shape every page is still crawled."""
    config = tmp_path / "crawl.toml"
    config.write_text("[traps]\nmax_actions_per_shape = 3\nshape_depth_slack = 0\n")
    run = courtly("crawl", server.url("words"), "--db", db, "--min-delay", "0",
                  "--config", config, "--progress", "off")
    assert run.status == 0, run.err
    codes = [c["exit_code"] for c in candidates(db).values()]
    assert codes == ["OK"] * 25, codes  # the home page, 12 wiki pages and 12 blog posts


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
    assert url_shape("http://a/s/AbCdEfGhIjKlMnOpQrStUv/page") == "/s/{t}/page"  # letters
    assert url_shape("http://a/sess/Zm9vYmFyYmF6cXV4cXV1eA-_/x") == "/sess/{t}/x"  # base64url
    assert url_shape("http://a/u/b279c01b-98c2-43f4-b4cb-ce5c7012eaa5") == "/u/{t}"  # a UUID
    for words in ("/documentation/", "/getting-started/", "/WikiPageName",
                  "/XMLHttpRequest_Level_Two", "/HTTPSConnectionPool", "/README_FIRST_PLEASE",
                  "/Global_Objects/Array", "/getting-started-with-the-documentation"):
        assert url_shape("http://a" + words) == words
    assert url_shape("http://a/top-10-mp3-players-of-2024") == "/top-{n}-mp{n}-players-of-{n}"
    assert url_shape("http://a/a-" + "b" * 100_000) == "/a-" + "b" * 100_000  # one scan
    budget = ShapeBudget(3, slack=1)
    catalogue = [budget.spend(f"http://a/p/{i}", 2 + i % 2).allowed for i in range(100)]
    assert all(catalogue)
    deeper = [budget.spend(f"http://a/p/{i}", 4 + i).allowed for i in range(5)]  # ever deeper
    assert deeper == [True, True, True, False, False]
    assert budget.spend("http://a/p/7", 3).allowed  # within the slack: still free
    assert budget.spend("http://a/q/1", 9).allowed  # another shape has its own budget
    assert all(ShapeBudget(0).spend(f"http://a/p/{i}", i).allowed for i in range(100))  # 0: off
