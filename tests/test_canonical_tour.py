"""End to end: the messy ways sites use canonical URLs and redirects, against real HTTP servers
on 127.0.0.1 and real SQLite files and PostgreSQL schemas."""

from __future__ import annotations

import signal
from pathlib import Path

from courtly.site import LocalSite, Page, html
from tests.conftest import candidates, courtly, courtly_process, rows
from tests.hostile_server import Conn, HostileServer, Request, link_page, page, routes
from tests.pgserver import PgUrl
from tests.test_resume import wait_for_actions

PAIRS = 8


def canonical(href: str) -> str:
    """A page's canonical link element."""
    return f'<link rel="canonical" href="{href}">'


def kept(db: Path | str) -> set[str]:
    """The URLs whose content the crawl database keeps."""
    return {r["url"] for r in rows(db, "SELECT url FROM content")}


def test_a_canonical_chain_is_followed_one_hop_whatever_the_order(serve, db: Path) -> None:
    """A names B, B names C: a page crawled after B was kept as its own ("itself names
    canonical C", as if B named it back), beside C, the chain's end: two copies kept, or one,
    by the order of the crawl. A is now NOT_CANONICAL for B whatever B names, in either order;
    only a loop back to the page keeps it (the last of the loop crawled); and a page whose
    canonical URL answered 404 is kept, the detail saying so (it was lost)."""
    site = serve({"one": {
        "/": Page(html("Home", ["/chain-b", "/deeper", "/gone", "/loop-1"])),
        "/deeper": Page(html("Deeper", ["/chain-a", "/dead-end"])),  # crawled after /chain-b
        "/chain-a": Page(html("A", ["/from-a"], canonical("/chain-b"))),
        "/chain-b": Page(html("B", ["/from-b"], canonical("/chain-c"))),
        "/chain-c": Page(html("C", [], canonical("/chain-c"))),
        "/dead-end": Page(html("Dead end", [], canonical("/gone"))),
        "/loop-1": Page(html("L1", [], canonical("/loop-2"))),
        "/loop-2": Page(html("L2", [], canonical("/loop-3"))),
        "/loop-3": Page(html("L3", [], canonical("/loop-1"))),
    }})
    run = courtly("crawl", site.url("one"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    cands = {url.removeprefix(site.origins["one"]): c for url, c in candidates(db).items()}
    for path, named in (("/chain-a", "/chain-b"), ("/chain-b", "/chain-c"),
                        ("/loop-1", "/loop-2"), ("/loop-2", "/loop-3")):
        record = cands[path]
        assert (record["exit_code"], record["canonical"]) == (
            "NOT_CANONICAL", site.url("one", named)), record
    assert cands["/loop-3"]["detail"] == (f"canonical {site.url('one', '/loop-1')} is one of 3 "
                                          "pages naming each other in a loop: kept")
    assert cands["/dead-end"]["detail"] == (f"canonical {site.url('one', '/gone')} was "
                                            "HTTP_CLIENT_ERROR: kept")
    assert kept(db) == {site.url("one", p) for p in ("/", "/deeper", "/chain-c", "/dead-end",
                                                       "/loop-3")}


def pair_sites() -> dict[str, dict[str, Page]]:
    """Two origins whose pages name each other's as canonical (filled in once served)."""
    return {name: {"/": Page(html(name, [f"/{name}{i}" for i in range(PAIRS)]))}
            for name in ("x", "y")}


def name_each_other(site: LocalSite, delay: float = 0.0) -> None:
    """Page x/xN names y/yN as its canonical URL, and y/yN names x/xN."""
    for i in range(PAIRS):
        for name, other in (("x", "y"), ("y", "x")):
            site.sites[name][f"/{name}{i}"] = Page(
                html(f"{name}{i}", [], canonical(site.url(other, f"/{other}{i}"))), delay=delay)


def decisions(db: Path | str, site: LocalSite) -> list[tuple[str, str]]:
    """Each pair's two exit codes (x's, y's)."""
    cands = candidates(db)
    return [(cands[site.url("x", f"/x{i}")]["exit_code"],
             cands[site.url("y", f"/y{i}")]["exit_code"]) for i in range(PAIRS)]


def test_pages_of_two_origins_naming_each_other_keep_one_on_postgres(
        serve, pg_url: PgUrl) -> None:
    """Two origins' crawl loops reading the pages of a pair (x names y, y names x) at once on
    PostgreSQL each looked for the other's record before it was written: both were
    NOT_CANONICAL and the content was lost. Exactly one of each pair is now kept."""
    site = serve(pair_sites())
    name_each_other(site)
    run = courtly("crawl", site.url("x"), site.url("y"), "--db", pg_url, "--min-delay", "0")
    assert run.status == 0, run.err
    assert all(sorted(pair) == ["NOT_CANONICAL", "OK"] for pair in decisions(pg_url, site)), (
        decisions(pg_url, site))


def test_a_kill_9_does_not_change_which_page_of_a_pair_is_kept(serve, pg_url: PgUrl) -> None:
    """Killed mid-crawl and resumed, a fleet's store keeps the pairs decided before the kill as
    they were, and exactly one page of each pair."""
    site = serve(pair_sites())
    name_each_other(site, delay=0.05)
    proc = courtly_process("crawl", site.url("x"), site.url("y"), "--db", pg_url,
                           "--min-delay", "0.05", "--progress", "off")
    wait_for_actions(pg_url, PAIRS)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    before = {r["url"]: r["exit_code"] for r in rows(
        pg_url, "SELECT url, exit_code FROM candidates WHERE exit_code IS NOT NULL")}
    resumed = courtly("crawl", "--db", pg_url, "--min-delay", "0")
    assert resumed.status == 0, resumed.err
    after = {url: c["exit_code"] for url, c in candidates(pg_url).items()}
    assert {url: after[url] for url in before} == before
    assert all(sorted(pair) == ["NOT_CANONICAL", "OK"] for pair in decisions(pg_url, site)), (
        decisions(pg_url, site))


async def cookie_gate(conn: Conn, req: Request) -> None:
    """A page behind a cookie check: without the cookies, a redirect to itself that sets them
    (one with an Expires date, whose comma a joined header would split)."""
    if req.headers.get("cookie") == "visited=1; lang=en":
        await conn.send(link_page(["/inside"], "the page behind the gate"))
        return
    await conn.send(b"HTTP/1.1 302 Found\r\nLocation: /gate\r\nContent-Length: 0\r\n"
                    b"Set-Cookie: visited=1; Path=/; Expires=Wed, 21 Oct 2037 07:28:00 GMT\r\n"
                    b"Set-Cookie: lang=en; HttpOnly\r\nConnection: close\r\n\r\n")


def test_a_redirect_to_itself_setting_a_cookie_is_asked_once_more_with_it(db: Path) -> None:
    """A site checking that its visitors keep cookies answers the first request with a redirect
    to the URL itself that sets one; a browser asks again, with it, and gets the page. courtly
    recorded "redirects to itself: not queued" and the page was lost. It now asks once more
    with the cookies that redirect set (name=value, as a browser sends them), as it asks a Java
    server's /a;jsessionid=… once more; a server redirecting again is given up."""
    pages = {"/": link_page(["/gate", "/loop"]), "/gate": cookie_gate,
             "/inside": page("<p>inside</p>"),
             "/loop": page("", status="302 Found", Location="/loop", Set_Cookie="a=1")}
    with HostileServer({"a": routes(pages)}) as server:
        run = courtly("crawl", server.url("a"), "--db", db, "--min-delay", "0")
        assert run.status == 0, run.err
        cands = candidates(db)
        assert cands[server.url("a", "/gate")]["exit_code"] == "OK"
        assert server.url("a", "/inside") in cands  # its links followed
        gate_log = rows(db, "SELECT detail FROM crawl_log WHERE url = ? ORDER BY id",
                        server.url("a", "/gate"))
        assert [r["detail"] for r in gate_log] == [
            "redirects to itself setting a cookie: asked once more with it", None]
        assert cands[server.url("a", "/loop")]["detail"] == (
            "redirects to itself with its cookies, again: not queued")
        assert [h.path for h in server.hits_for("a")].count("/loop") == 2
