"""End to end: the core crawl loop against real HTTP servers on 127.0.0.1 and a real SQLite file."""

from __future__ import annotations

import asyncio
import gzip
import itertools
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import brotli

from courtly.site import Page, html
from tests.conftest import candidates, courtly, fetched_paths, robots, rows
from tests.hostile_server import Conn, HostileServer, Request, page, routes

BACKENDS = ("sqlite", "postgres")  # the `db` tests run on both (tests/conftest.py)


def site_pages() -> dict[str, Page]:
    return {
        "/robots.txt": robots("User-agent: *\nDisallow: /private/\n"),
        "/": Page(html("Home", ["/a", "/b#frag", "/old", "/private/p", "/doc.pdf", "/missing",
                                "/print", "/hidden", "/nf", "/q?b=2&a=1", "mailto:x@y.z"])),
        "/a": Page(html("A", ["/", "/b", "a2"])),
        "/a2": Page(html("A2", ["/"])),
        "/b": Page(html("B", ["/a"])),
        "/old": Page("", 301, {"Location": "/new"}),
        "/new": Page(html("New", [])),
        "/private/p": Page(html("Private", [])),
        "/doc.pdf": Page(b"%PDF-1.4", headers={"Content-Type": "application/pdf"}),
        "/print": Page(html("Print", ["/print-only"], '<link rel="canonical" href="/a">')),
        "/print-only": Page(html("never linked from a kept page", [])),
        "/hidden": Page(html("Hidden", ["/from-hidden"], '<meta name="robots" content="noindex">')),
        "/from-hidden": Page(html("From hidden", [])),
        "/nf": Page(html("NF", ["/nf-child"], '<meta name="robots" content="nofollow">')),
        "/nf-child": Page(html("unreachable", [])),
        "/q?a=1&b=2": Page(html("Q", [])),
    }


def test_crawls_every_allowed_page_once_with_directives(serve, db: Path) -> None:
    site = serve({"one": site_pages(), "two": {"/": Page(html("Two", ["/x"])),
                                               "/x": Page(html("X", []))}})
    one, two = site.origins["one"], site.origins["two"]
    # a link to the other configured origin, and one to an origin that is not configured
    site.sites["one"]["/b"] = Page(html("B", ["/a", two + "/x", "http://127.0.0.1:9/elsewhere"]))
    run = courtly("crawl", one + "/", two + "/", "--db", db, "--min-delay", "0.01")
    assert run.status == 0, run.err

    paths = fetched_paths(site, "one")
    assert sorted(paths) == sorted(set(paths)), "a page was fetched twice"
    assert set(paths) == {"/", "/a", "/a2", "/b", "/old", "/new", "/doc.pdf", "/missing",
                          "/print", "/hidden", "/from-hidden", "/nf", "/q?a=1&b=2"}
    assert set(fetched_paths(site, "two")) == {"/", "/x"}

    cands = candidates(db)
    code = {url.removeprefix(one): c["exit_code"] for url, c in cands.items()}
    assert code["/"] == "OK"
    assert code["/old"] == "REDIRECT"
    assert cands[one + "/old"]["redirect_target"] == one + "/new"
    assert code["/private/p"] == "BLOCKED_BY_ROBOTS_TXT"
    assert code["/doc.pdf"] == "UNSUPPORTED_CONTENT"
    assert cands[one + "/doc.pdf"]["content_type"] == "application/pdf"
    assert code["/missing"] == "HTTP_CLIENT_ERROR"
    assert cands[one + "/missing"]["state"] == "ERROR"
    assert code["/print"] == "NOT_CANONICAL"
    assert cands[one + "/print"]["canonical"] == one + "/a"
    assert code["/hidden"] == "NOINDEX"
    assert code["/from-hidden"] == "OK"  # noindex alone still follows links
    assert "/nf-child" not in code  # nofollow: links not saved
    assert "/print-only" not in code  # a non-canonical page's links are discarded
    assert not any("9/elsewhere" in url for url in cands)  # not a configured origin
    assert all(c["state"] in ("CRAWLED", "ERROR") for c in cands.values())

    redirects = rows(db, "SELECT url, target, status FROM redirects")
    assert redirects == [{"url": one + "/old", "target": one + "/new", "status": 301}]
    stored = {r["url"] for r in rows(db, "SELECT url FROM content")}
    assert one + "/" in stored
    assert one + "/hidden" not in stored  # noindex: content not kept
    log = rows(db, "SELECT url, exit_code FROM crawl_log")
    assert Counter(r["url"] for r in log).most_common(1)[0][1] == 1


def test_stats_and_export_formats(serve, db: Path, tmp_path: Path) -> None:
    site = serve({"one": site_pages()})
    assert courtly("crawl", site.url("one"), "--db", db, "--min-delay", "0").status == 0
    stats = courtly("stats", "--db", db)
    assert stats.status == 0
    for word in ("CRAWLED", "BLOCKED_BY_ROBOTS_TXT", "REDIRECT", site.origins["one"]):
        assert word in stats.out
    out = tmp_path / "export.csv"
    assert courtly("export", "--db", db, "--format", "csv", "--out", out).status == 0
    lines = out.read_text().splitlines()
    header = lines[0].split(",")
    for column in ("url", "origin", "state", "exit_code", "http_status", "last_crawl",
                   "content_type", "content_length", "redirect_target", "canonical", "depth"):
        assert column in header
    assert len(lines) == 1 + len(candidates(db))


def test_min_delay_and_one_request_in_flight_per_origin(serve, db: Path) -> None:
    def pages(name: str) -> dict[str, Page]:  # two origins, different bytes: no duplicates
        table = {"/": Page(html(f"Home {name}", [f"/p{i}" for i in range(8)]))}
        return table | {f"/p{i}": Page(html(f"P{i} {name}", []), delay=0.02) for i in range(8)}

    site = serve({"a": pages("a"), "b": pages("b")})
    run = courtly("crawl", site.url("a"), site.url("b"), "--db", db, "--min-delay", "0.1",
                  "--concurrency", "4")
    assert run.status == 0, run.err
    for name in ("a", "b"):
        hits = site.hits_for(name)
        assert len(hits) == 10  # robots.txt + 9 pages
        for before, after in itertools.pairwise(hits):
            assert after.arrived >= before.done, "two requests in flight to one origin"
            assert after.arrived - before.done >= 0.1 - 0.005
    # the two origins were crawled at the same time, taking turns
    a, b = site.hits_for("a"), site.hits_for("b")
    assert a[0].arrived < b[-1].arrived and b[0].arrived < a[-1].arrived


def test_budget_then_resume_crawls_each_page_once(serve, db: Path) -> None:
    pages = {"/": Page(html("Home", [f"/p{i}" for i in range(20)]))}
    pages |= {f"/p{i}": Page(html(f"P{i}", ["/"])) for i in range(20)}
    site = serve({"a": pages})
    first = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--max-actions", "5")
    assert first.status == 0
    assert len(rows(db, "SELECT * FROM crawl_log")) == 5
    second = courtly("crawl", "--db", db, "--min-delay", "0")
    assert second.status == 0
    paths = fetched_paths(site, "a")
    assert sorted(paths) == sorted(set(paths)) and len(paths) == 21
    log = rows(db, "SELECT url FROM crawl_log")
    assert len(log) == 21 == len({r["url"] for r in log})
    # finished: a third run has nothing due
    third = courtly("crawl", "--db", db, "--min-delay", "0")
    assert third.status == 0 and len(fetched_paths(site, "a")) == 21


def test_the_budget_counts_urls_taken_not_origins_still_reading_robots_txt(
        serve, db: Path) -> None:
    """--max-actions 5 with ten other origins whose robots.txt takes 2 s: every turn in flight
    counted against the budget, so the crawl stopped at once, 'budget of 5 crawl actions spent.
    0 actions'. Now the URLs taken count: five pages are crawled."""
    pages = {"/": Page(html("Home", [f"/p{i}" for i in range(20)]))}
    pages |= {f"/p{i}": Page(html(f"P{i}", ["/"])) for i in range(20)}
    site = serve({"a": pages})

    async def slow_robots(conn: Conn, req: Request) -> None:
        await asyncio.sleep(2)
        await conn.send(page("", "text/plain", "404 Not Found"))

    slow = {f"s{i}": routes({"/robots.txt": slow_robots}) for i in range(10)}
    with HostileServer(slow) as other:
        run = courtly("crawl", site.url("a"), *[other.url(name) for name in slow], "--db", db,
                      "--min-delay", "0", "--max-actions", "5")
    assert run.status == 0, run.err
    assert "budget of 5 crawl actions spent. 5 actions" in run.err
    assert len(rows(db, "SELECT * FROM crawl_log")) == 5


def test_encodings_and_charsets(serve, db: Path) -> None:
    latin = html("Caf\xe9", ["/gz", "/br", "/bad", "/br-bomb"]).encode("latin-1")
    gz = gzip.compress(html("GZ", ["/gz-child"]).encode())
    br = brotli.compress(html("BR", ["/br-child"]).encode())
    site = serve({"a": {
        "/": Page(latin, headers={"Content-Type": "text/html; charset=iso-8859-1"}),
        "/gz": Page(gz, headers={"Content-Type": "text/html", "Content-Encoding": "gzip"}),
        "/br": Page(br, headers={"Content-Type": "text/html", "Content-Encoding": "br"}),
        "/br-bomb": Page(brotli.compress(b"\0" * (60 << 20), quality=1),  # over 50 MiB decoded
                         headers={"Content-Type": "text/html", "Content-Encoding": "br"}),
        "/bad": Page(b"<a href='/bad-child'>\xff\xfe\x80</a>",
                     headers={"Content-Type": "text/html; charset=bogus-charset"}),
        "/gz-child": Page(html("c", [])), "/br-child": Page(html("c", [])),
        "/bad-child": Page(html("c", [])),
    }})
    assert courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0").status == 0
    assert set(fetched_paths(site, "a")) == {"/", "/gz", "/br", "/bad", "/gz-child",
                                             "/br-child", "/bad-child", "/br-bomb"}
    code = {url.removeprefix(site.url("a", "")): c["exit_code"]
            for url, c in candidates(db).items()}
    assert code["/br"] == "OK"  # brotli >= 1.2: decoded with a cap on what it makes
    assert code["/br-bomb"] == "TOO_LARGE"
    assert site.hits_for("a")[1].headers.get("Accept-Encoding", "").count("br") == 1


def test_legacy_charsets_are_read_as_browsers_read_them(serve, db: Path) -> None:
    """A page's labels as the WHATWG Encoding Standard reads them. Before: a windows-1252 page
    labelled iso-8859-1 (as most are) linked to /%C2%80 for its /€; a GBK page labelled gb2312,
    a windows-949 page labelled euc-kr and a windows-31J page labelled shift_jis lost their
    characters outside the old standards (U+FFFD in the link, the text, the signature); a
    `charset=utf-16` page without a BOM was read as UTF-8 (no link found); a `charset=utf-7`,
    which no browser knows, was obeyed. Now they link where a browser would go."""
    def page(text: str, encoding: str, content_type: str, head: str = "") -> Page:
        body = html(text, [f"/{text}"], head).encode(encoding)
        return Page(body, headers={"Content-Type": content_type})

    site = serve({"a": {
        "/": Page(html("Home", ["/latin", "/gbk", "/kr", "/sjis", "/u16", "/u7", "/quoted"])),
        "/latin": page("\u20ac", "cp1252", "text/html; charset=ISO-8859-1"),
        "/gbk": page("\u9555", "gbk", "text/html; charset=gb2312"),
        "/kr": page("\ub620", "cp949", "text/html", '<meta charset="euc-kr">'),
        "/sjis": page("\u2460", "cp932", "text/html; charset=foo", "<meta charset=shift_jis>"),
        "/u16": page("sixteen", "utf-16-le", "text/html; charset=utf-16"),
        "/u7": page("\u20ac7", "cp1252", "text/html; charset=utf-7",
                    '<meta charset="windows-1252">'),
        "/quoted": page("\u00e9", "cp1252", 'text/html; charset="windows-1252"'),
    }})
    assert courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0").status == 0
    found = {url.removeprefix(site.url("a", "")) for url in candidates(db)}
    assert found >= {"/%E2%82%AC", "/%E9%95%95", "/%EB%98%A0", "/%E2%91%A0", "/sixteen",
                     "/%E2%82%AC7", "/%C3%A9"}, found
    assert not any("%EF%BF%BD" in path or "%C2%80" in path for path in found)


def test_an_xhtml_pages_xml_declaration_names_its_encoding(serve, db: Path) -> None:
    """An XHTML page (application/xhtml+xml) whose encoding only its XML declaration names was
    read as UTF-8: its windows-1252 /€ was linked as /%EF%BF%BD. Now the declaration counts
    after a BOM and the header's charset (WHATWG's XML parser), and the query is in it too."""
    def xhtml(link: str, encoding: str, declared: str, content_type: str) -> Page:
        body = (f'<?xml version="1.0" encoding="{declared}"?>\n<html xmlns='
                f'"http://www.w3.org/1999/xhtml"><head><title>{link}</title></head><body>'
                f'<p><a href="{link}">x</a></p></body></html>').encode(encoding)
        return Page(body, headers={"Content-Type": content_type})

    site = serve({"a": {
        "/": Page(html("Home", ["/declared", "/header", "/html"])),
        "/declared": xhtml("/\u20ac?q=\u00e9", "cp1252", "ISO-8859-1", "application/xhtml+xml"),
        "/header": xhtml("/\u00e9", "utf-8", "windows-1252",
                         "application/xhtml+xml; charset=utf-8"),
        "/html": xhtml("/h\u00e9", "utf-8", "windows-1252", "text/html"),  # no XML parser
    }})
    assert courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0").status == 0
    found = {url.removeprefix(site.url("a", "")) for url in candidates(db)}
    assert found >= {"/%E2%82%AC?q=%E9", "/%C3%A9", "/h%C3%A9"}, found
    assert not any("%EF%BF%BD" in path or "%C3%83" in path for path in found)


def test_a_legacy_pages_link_queries_are_in_its_encoding(db: Path) -> None:
    """WHATWG's URL parser writes a link's query in its page's encoding (the path and fragment
    in UTF-8; a character the encoding lacks as "&#N;"), and a server of such pages reads its
    queries so. Before: every query was sent in UTF-8 (`?q=%E6%97%A5%E6%9C%AC` for a Shift_JIS
    page's `?q=日本`: another query to that server). The server records the raw targets."""
    def legacy(links: list[str], encoding: str, content_type: str, head: str = "") -> bytes:
        anchors = "".join(f'<a href="{href}">x</a>' for href in links)
        body = f"<html><head>{head}<title>{encoding}</title></head><body>{anchors}</body></html>"
        return page(body.encode(encoding), content_type)

    sjis = ["/search?q=\u65e5\u672c", "/\u65e5?q=\u2460&eacute;#\u672c", "?q=\u8868"]
    latin = ["/find?q=caf\u00e9&c=\u20ac", "/caf\u00e9?q=&#26085;x", "/f?q=%E9&r=\u00e9"]
    pages = {
        "/": page(html("Home", ["/sjis", "/latin", "/utf8"])),
        "/sjis": legacy(sjis, "cp932", "text/html", '<meta charset="shift_jis">'),
        "/latin": legacy(latin, "cp1252", "text/html; charset=iso-8859-1"),
        "/utf8": page(html("UTF-8", ["/u?q=\u65e5\u672c"])),
    }
    with HostileServer({"a": routes(pages)}) as server:
        run = courtly("crawl", server.url("a"), "--db", db, "--min-delay", "0")
        assert run.status == 0, run.err
        targets = {hit.path for hit in server.hits}
    # 本 is 0x96 0x7B and 表 0x95 0x5C in Shift_JIS: "{" and "\\" are not escaped in a query
    # (the special-query percent-encode set), as a browser sends them; é (an HTML entity on the
    # page) is not Shift_JIS
    assert targets >= {"/search?q=%93%FA%96{", "/%E6%97%A5?q=%87@%26%23233%3B",
                       "/sjis?q=%95\\",
                       "/find?c=%80&q=caf%E9", "/caf%C3%A9?q=%26%2326085%3Bx",
                       "/f?q=%E9&r=%E9", "/u?q=%E6%97%A5%E6%9C%AC"}, targets


def test_x_robots_tag_header(serve, db: Path) -> None:
    site = serve({"a": {
        "/": Page(html("Home", ["/n", "/f"])),
        "/n": Page(html("N", []), headers={"Content-Type": "text/html", "X-Robots-Tag": "noindex"}),
        "/f": Page(html("F", ["/f-child"]),
                   headers={"Content-Type": "text/html", "X-Robots-Tag": "courtly: nofollow"}),
        "/f-child": Page(html("never", [])),
    }})
    assert courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0").status == 0
    cands = candidates(db)
    assert cands[site.url("a", "/n")]["exit_code"] == "NOINDEX"
    assert site.url("a", "/f-child") not in cands


def test_x_robots_tag_for_another_crawler_is_not_ours(db: Path) -> None:
    """`X-Robots-Tag: otherbot: noindex, nofollow` is otherbot's, both directives (a user agent's
    name is for the list after it): courtly obeyed its nofollow and dropped the page's links.
    A header without a name is for every crawler, whatever header names an agent before it."""
    def answer(links: list[str], *robots_tags: str) -> bytes:
        body = html(f"page {links}", links).encode()
        head = "".join(f"X-Robots-Tag: {tag}\r\n" for tag in robots_tags)
        return (f"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n{head}Content-Length: "
                f"{len(body)}\r\nConnection: close\r\n\r\n").encode() + body

    pages = {
        "/": answer(["/other", "/two", "/ours", "/valued"]),
        "/other": answer(["/other-child"], "otherbot: noindex, nofollow"),
        "/two": answer(["/two-child"], "otherbot: noindex", "nofollow"),
        "/ours": answer(["/ours-child"], "otherbot: noindex", "courtly: noindex, nofollow"),
        "/valued": answer(["/valued-child"],
                          "unavailable_after: 25 Jun 2010 15:00:00 PST, noindex"),
    }
    pages |= {f"/{name}-child": answer([]) for name in ("other", "two", "ours", "valued")}
    with HostileServer({"a": routes(pages)}) as server:
        run = courtly("crawl", server.url("a"), "--db", db, "--min-delay", "0")
        assert run.status == 0, run.err
        cands = candidates(db)
        assert cands[server.url("a", "/other")]["exit_code"] == "OK"
        assert server.url("a", "/other-child") in cands  # its links followed
        assert cands[server.url("a", "/two")]["exit_code"] == "OK"
        assert server.url("a", "/two-child") not in cands  # the second header is for all
        assert cands[server.url("a", "/ours")]["exit_code"] == "NOINDEX"
        assert server.url("a", "/ours-child") not in cands
        assert cands[server.url("a", "/valued")]["exit_code"] == "NOINDEX"


def test_a_redirect_out_of_scope_says_so(serve, db: Path) -> None:
    """A seed answering 301 to another origin (http:// to https://, a www. host) ended the
    crawl after one action, REDIRECT with no detail: nothing told the user that the target
    was not queued because it is not in scope."""
    site = serve({"new": {"/": Page(html("New", []))}, "old": {}})
    target = site.url("new")
    site.sites["old"]["/"] = Page("", 301, {"Location": target})
    run = courtly("crawl", site.url("old"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    [log] = rows(db, "SELECT exit_code, detail FROM crawl_log")
    assert log["exit_code"] == "REDIRECT"
    assert log["detail"] == f"target {target} not in scope (scope = origin): not queued"
    assert fetched_paths(site, "new") == []


def test_a_canonical_url_out_of_scope_keeps_the_page(serve, db: Path) -> None:
    """A site reached over http:// whose pages name their https:// URL as canonical (or another
    host's) was lost whole: the seed was NOT_CANONICAL, its content dropped and its links not
    followed, and the canonical URL, another origin, was never crawled: one action, nothing
    kept. A canonical URL out of scope now leaves the page kept as its own; one in scope (here
    the other seed's) still replaces it."""
    def pages(name: str, canonical_origin: str) -> dict[str, Page]:
        def page(path: str, links: list[str]) -> Page:
            head = f'<link rel="canonical" href="{canonical_origin}{path}">'
            return Page(html(f"{name} {path}", links, head))
        return {"/": page("/", ["/a"]), "/a": page("/a", [])}

    site = serve({"mirror": {}, "main": {}})
    site.sites["mirror"].update(pages("mirror", site.origins["main"]))
    site.sites["main"].update(pages("main", "https://127.0.0.1:1"))
    run = courtly("crawl", site.url("main"), site.url("mirror"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    cands = candidates(db)
    for path in ("/", "/a"):
        kept = cands[site.url("main", path)]
        assert kept["exit_code"] == "OK", kept
        assert kept["detail"] == (f"canonical https://127.0.0.1:1{path} not in scope "
                                  "(scope = origin): kept")
    assert cands[site.url("mirror")]["exit_code"] == "NOT_CANONICAL"
    assert fetched_paths(site, "mirror") == ["/"]  # its links are not followed
    stored = rows(db, "SELECT url FROM content")
    assert sorted(r["url"] for r in stored) == [site.url("main"), site.url("main", "/a")]


def test_bad_input_is_one_line_and_writes_nothing(db: Path, tmp_path: Path) -> None:
    bad_seed = courtly("crawl", "not a url", "--db", db)
    assert bad_seed.status == 2
    assert "invalid seed URL" in bad_seed.err and len(bad_seed.err.strip().splitlines()) == 1
    assert not db.exists()

    config = tmp_path / "crawl.toml"
    config.write_text("concurrency = 0\n[politeness]\npatience = 3\n")
    bad_config = courtly("crawl", "http://127.0.0.1:1/", "--config", config, "--db", db)
    assert bad_config.status == 2 and "concurrency" in bad_config.err
    config.write_text("[politeness]\nspeed = 3\n")
    unknown = courtly("crawl", "http://127.0.0.1:1/", "--config", config, "--db", db)
    assert unknown.status == 2 and "politeness.speed: unknown key" in unknown.err
    config.write_text("this is = not toml =\n")
    broken = courtly("crawl", "http://127.0.0.1:1/", "--config", config, "--db", db)
    assert broken.status == 2 and "invalid TOML" in broken.err
    missing = courtly("crawl", "--db", db)
    assert missing.status == 2 and "no seeds" in missing.err
    assert not db.exists()
    assert courtly("stats", "--db", db).status == 2
    strategy = courtly("crawl", "http://127.0.0.1:1/", "--db", db, "--strategy", "nope")
    assert strategy.status == 2 and "unknown strategy" in strategy.err


def test_config_file_keys_and_flag_override(serve, db: Path, tmp_path: Path) -> None:
    site = serve({"a": {"/": Page(html("Home", ["/x"])), "/x": Page(html("X", []))}})
    config = tmp_path / "crawl.toml"
    config.write_text(
        f'seeds = ["{site.url("a")}"]\ndb = "{db}"\nuser_agent = "FileBot/1.0"\n'
        "min_delay = 5.0\nmax_actions = 1\n"
    )
    run = courtly("crawl", "--config", config, "--min-delay", "0", "--user-agent", "FlagBot/2")
    assert run.status == 0
    hits = site.hits_for("a")
    assert len(hits) == 2  # robots.txt + one page: max_actions from the file
    assert hits[0].headers["User-Agent"] == "FlagBot/2"  # the flag wins over the file


def test_database_that_is_not_a_database(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    run = courtly("stats", "--db", junk)
    assert run.status == 1 and "not a courtly database" in run.err
    assert junk.read_bytes().startswith(b"this is not sqlite")


def test_origin_out_of_work_is_reopened_by_new_links(serve, db: Path) -> None:
    """An origin with nothing to do at first is crawled as soon as another origin links to it."""
    site = serve({"a": {"/": Page(html("A", ["/slow"])), "/slow": Page(html("slow", []))},
                  "b": {"/": Page(html("B", []))}})
    # b's home is crawled in a first run; in the second run only a links to a new page of b
    assert courtly("crawl", site.url("a"), site.url("b"), "--db", db,
                   "--min-delay", "0").status == 0
    site.sites["b"]["/late"] = Page(html("late", []))
    site.sites["a"]["/new"] = Page(html("new", [site.url("b", "/late")]), delay=0.2)
    assert courtly("add-seeds", site.url("a", "/new"), "--db", db).status == 0
    assert courtly("crawl", "--db", db, "--min-delay", "0").status == 0
    assert "/late" in fetched_paths(site, "b")
    assert candidates(db)[site.url("b", "/late")]["state"] == "CRAWLED"


def test_odd_status_codes_are_protocol_errors(serve, db: Path) -> None:
    site = serve({"a": {"/": Page(html("A", ["/odd"])), "/odd": Page("x", 999)}})
    assert courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0").status == 0
    assert candidates(db)[site.url("a", "/odd")]["exit_code"] == "PROTOCOL_ERROR"


def test_a_link_header_names_the_canonical_url_of_a_file_or_a_page(serve, db: Path) -> None:
    """`Link: <…>; rel="canonical"` was ignored: a PDF served under two URLs was kept twice,
    and a page naming its canonical URL only in the header was kept as its own. The header now
    counts as a page's link element does, for files too; a page whose element and header name
    different canonical URLs follows neither and is kept, the detail naming both."""
    def linked(path: str) -> dict[str, str]:
        return {"Link": f'<https://cdn.example/x.js>; rel=preload, <{path}>; rel="canonical"'}

    pdf = {"Content-Type": "application/pdf"}
    site = serve({"one": {
        "/": Page(html("Home", ["/a.pdf", "/hdr", "/both", "/self"])),
        "/a.pdf": Page(b"%PDF-1.4 a", headers=pdf | linked("/doc.pdf")),
        "/doc.pdf": Page(b"%PDF-1.4 doc", headers=pdf),
        "/hdr": Page(html("Hdr", ["/hdr-only"]), headers={"Content-Type": "text/html"}
                     | linked("/page")),
        "/page": Page(html("Page", [])),
        "/both": Page(html("Both", ["/both-link"], '<link rel="canonical" href="/page">'),
                      headers={"Content-Type": "text/html"} | linked("/other")),
        "/both-link": Page(html("Both link", [])),
        "/self": Page(html("Self", []), headers={"Content-Type": "text/html", "Link":
                                                 '</self>; rel="canonical nofollow"'}),
    }})
    run = courtly("crawl", site.url("one"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    cands = candidates(db)
    for path, canonical in (("/a.pdf", "/doc.pdf"), ("/hdr", "/page")):
        record = cands[site.url("one", path)]
        assert (record["exit_code"], record["canonical"]) == (
            "NOT_CANONICAL", site.url("one", canonical)), record
    assert cands[site.url("one", "/doc.pdf")]["exit_code"] == "UNSUPPORTED_CONTENT"
    assert cands[site.url("one", "/self")]["exit_code"] == "OK"
    both = cands[site.url("one", "/both")]
    assert both["exit_code"] == "OK"
    assert both["detail"] == (f"canonical link element {site.url('one', '/page')} and Link "
                              f"header {site.url('one', '/other')} disagree: kept")
    assert set(fetched_paths(site, "one")) == {"/", "/a.pdf", "/doc.pdf", "/hdr", "/page",
                                               "/both", "/both-link", "/self"}
    stored = {r["url"] for r in rows(db, "SELECT url FROM content")}
    assert site.url("one", "/both") in stored and site.url("one", "/hdr") not in stored


def test_an_immediate_meta_refresh_is_a_redirect(serve, db: Path) -> None:
    """A page whose `<meta http-equiv="refresh" content="0; url=/other">` sends browsers on was
    kept as a page and its target never crawled. A refresh to another URL within 5 seconds is
    now a redirect: recorded as one (REDIRECT, the redirects table, its delay in the detail),
    its target queued under the scope rules of an HTTP redirect, the page's own links not
    followed. The content attribute is read as browsers read it; a longer delay, or a refresh
    of the page itself, leaves a page."""
    site = serve({"one": {}, "elsewhere": {"/": Page(html("Elsewhere", []))}})
    elsewhere = site.url("elsewhere")
    contents = {"/plain": "0; url=/t1", "/quoted": "0;URL='/t2'", "/spaced": "0 ; url = /t3",
                "/late": "5, /t4", "/slow": "6; url=/t5", "/reload": "0",
                "/away": f"0; url={elsewhere}"}
    site.sites["one"].update({
        "/": Page(html("Home", list(contents))),
        **{path: Page(html("Moved", [path + "-link"],
                           f'<meta http-equiv="Refresh" content="{content}">'))
           for path, content in contents.items()},
        **{f"/t{i}": Page(html(f"T{i}", [])) for i in range(1, 6)},
    })
    run = courtly("crawl", site.url("one"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    cands = candidates(db)
    moved = {"/plain": "/t1", "/quoted": "/t2", "/spaced": "/t3", "/late": "/t4"}
    for path, target in moved.items():
        record = cands[site.url("one", path)]
        assert (record["exit_code"], record["redirect_target"]) == (
            "REDIRECT", site.url("one", target)), record
        assert record["detail"] == f"meta refresh after {5 if path == '/late' else 0} s"
        assert cands[site.url("one", target)]["exit_code"] == "OK"
    for path in ("/slow", "/reload"):
        assert cands[site.url("one", path)]["exit_code"] == "OK"
    away = cands[site.url("one", "/away")]
    assert (away["exit_code"], away["redirect_target"]) == ("REDIRECT", elsewhere)
    assert away["detail"] == f"target {elsewhere} not in scope (scope = origin): not queued"
    assert fetched_paths(site, "elsewhere") == []
    # the pages that are redirects have their links dropped; the others are pages
    assert {path for path in fetched_paths(site, "one") if path.endswith("-link")} == {
        "/slow-link", "/reload-link"}
    assert "/t5" not in fetched_paths(site, "one")
    redirects = {r["url"]: r["target"] for r in rows(db, "SELECT url, target FROM redirects")}
    assert redirects == {site.url("one", p): site.url("one", t) for p, t in moved.items()} | {
        site.url("one", "/away"): elsewhere}


def test_an_immediate_refresh_header_is_a_redirect(serve, db: Path) -> None:
    """A `Refresh: 0; url=/other` response header, which browsers obey as they obey a meta
    refresh, was ignored: the page kept, the file fingerprinted, /other never crawled. It is now
    a redirect for a page and for a file alike (detail "Refresh header after N s"), read by the
    meta refresh's parser, before a meta refresh in the body; a longer delay, or a refresh of
    the response itself, is not one."""
    site = serve({"one": {}})
    refreshes = {"/page": ("text/html", "0; url=/t1"), "/file": ("application/pdf", "2,/t2"),
                 "/both": ("text/html", "0;URL='/t3'"), "/slow": ("text/html", "6; url=/t4"),
                 "/reload": ("text/plain", "0"), "/self": ("text/html", "1; url=/self")}
    site.sites["one"].update({
        "/": Page(html("Home", list(refreshes))),
        **{path: Page(html("Moved", [path + "-link"],
                           '<meta http-equiv="refresh" content="0; url=/meta">'
                           if path == "/both" else ""),
                      headers={"Content-Type": kind, "Refresh": value})
           for path, (kind, value) in refreshes.items()},
        **{f"/t{i}": Page(html(f"T{i}", [])) for i in range(1, 5)},
        "/meta": Page(html("Meta", [])),
    })
    run = courtly("crawl", site.url("one"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    cands = candidates(db)
    moved = {"/page": ("/t1", 0), "/file": ("/t2", 2), "/both": ("/t3", 0)}
    for path, (target, delay) in moved.items():
        record = cands[site.url("one", path)]
        assert (record["exit_code"], record["redirect_target"], record["detail"]) == (
            "REDIRECT", site.url("one", target), f"Refresh header after {delay} s"), record
        assert cands[site.url("one", target)]["exit_code"] == "OK"
    assert {path: cands[site.url("one", path)]["exit_code"]
            for path in ("/slow", "/reload", "/self")} == {
        "/slow": "OK", "/reload": "UNSUPPORTED_CONTENT", "/self": "OK"}
    fetched = set(fetched_paths(site, "one"))
    assert {path for path in fetched if path.endswith("-link")} == {"/slow-link", "/self-link"}
    assert "/t4" not in fetched and "/meta" not in fetched
    redirects = {r["url"]: r["target"] for r in rows(db, "SELECT url, target FROM redirects")}
    assert redirects == {site.url("one", p): site.url("one", t) for p, (t, _) in moved.items()}
    stored = {r["url"] for r in rows(db, "SELECT url FROM content")}
    assert not stored & {site.url("one", path) for path in moved}


def test_a_page_is_kept_when_its_canonical_url_never_will_be(serve, db: Path) -> None:
    """Two pages naming each other as canonical were both NOT_CANONICAL, and a page whose
    canonical URL robots.txt disallows was dropped for a URL never fetched: the site's content
    was lost. The second of the pair is now kept (its canonical URL was seen naming it), and so
    is the page whose canonical URL is disallowed, with its links, the detail saying why."""
    site = serve({"one": {
        "/robots.txt": robots("User-agent: *\nDisallow: /blocked\n"),
        "/": Page(html("Home", ["/a", "/c"])),
        "/a": Page(html("A", ["/from-a"], '<link rel="canonical" href="/b">')),
        "/b": Page(html("B", ["/from-b"], '<link rel="canonical" href="/a">')),
        "/c": Page(html("C", ["/from-c"], '<link rel="canonical" href="/blocked">')),
        "/from-b": Page(html("From B", [])),
        "/from-c": Page(html("From C", [])),
    }})
    run = courtly("crawl", site.url("one"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    cands = candidates(db)
    a, b, c = (cands[site.url("one", p)] for p in ("/a", "/b", "/c"))
    assert (a["exit_code"], a["canonical"]) == ("NOT_CANONICAL", site.url("one", "/b"))
    assert (b["exit_code"], b["canonical"]) == ("OK", site.url("one", "/a"))
    assert b["detail"] == (f"canonical {site.url('one', '/a')} itself names canonical "
                           f"{site.url('one', '/b')}: kept")
    assert (c["exit_code"], c["canonical"]) == ("OK", site.url("one", "/blocked"))
    assert c["detail"] == (f"canonical {site.url('one', '/blocked')} is BLOCKED_BY_ROBOTS_TXT "
                           "(Disallow: /blocked (group *, line 2)): kept")
    assert set(fetched_paths(site, "one")) == {"/", "/a", "/b", "/c", "/from-b", "/from-c"}
    stored = {r["url"] for r in rows(db, "SELECT url FROM content")}
    assert stored == {site.url("one", p) for p in ("/", "/b", "/c", "/from-b", "/from-c")}


def test_a_link_with_a_user_name_and_password_is_the_page_itself(serve, db: Path) -> None:
    """A link http://user:secret@host/page was a crawl candidate of its own beside /page: the
    page was fetched once for each (courtly sends no credentials) and the password was kept in
    the crawl database (candidates, crawl log, export). Now it is the page's own URL."""
    site = serve({"s": {"/page": Page(html("Page", []))}})
    host = site.origins["s"].removeprefix("http://")
    site.sites["s"]["/"] = Page(html("Home", [f"http://user:secret@{host}/page", "/page",
                                              f"//other:secret@{host}/old"]))
    site.sites["s"]["/old"] = Page("", 301, {"Location": f"http://x:secret@{host}/new"})
    site.sites["s"]["/new"] = Page(html("New", []))
    run = courtly("crawl", site.url("s"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    assert sorted(fetched_paths(site, "s")) == ["/", "/new", "/old", "/page"]
    assert sorted(candidates(db)) == [site.url("s", p) for p in ("/", "/new", "/old", "/page")]
    assert rows(db, "SELECT target FROM redirects") == [{"target": site.url("s", "/new")}]
    assert "secret" not in courtly("export", "--db", db).out
    assert not [r for r in rows(db, "SELECT url FROM crawl_log") if "secret" in r["url"]]


def test_a_redirect_to_itself_with_a_session_id_is_asked_once_more(serve, db: Path) -> None:
    """A Java server answering /a with a redirect to /a;jsessionid=… (which normalizes to /a)
    recorded a redirect from /a to itself and the page was lost: never fetched, and on the next
    run that self-loop counted as a redirect chain. The Location is now asked once more as
    written: the page is /a's; a server that redirects again (to /c, or to another session id)
    costs two requests and is given up for the run; a plain redirect to itself costs one."""
    def fresh_session(path: str) -> Callable[[int], Page]:
        return lambda count: Page("", 302, {"Location": f"{path};jsessionid=S{count}"})

    site = serve({"java": {
        "/": Page(html("Home", ["/a", "/c", "/e", "/f"])),
        "/a": fresh_session("/a"), "/a;jsessionid=S0": Page(html("A", ["/b"])),
        "/b": Page(html("B", [])),
        "/c": fresh_session("/c"), "/c;jsessionid=S0": Page("", 302, {"Location": "/c"}),
        "/e": fresh_session("/e"), "/e;jsessionid=S0": fresh_session("/e"),
        "/f": Page("", 301, {"Location": "/f"}),
    }})
    run = courtly("crawl", site.url("java"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    assert sorted(fetched_paths(site, "java")) == sorted([
        "/", "/a", "/a;jsessionid=S0", "/b", "/c", "/c;jsessionid=S0", "/e",
        "/e;jsessionid=S0", "/f"])
    cands = {url.removeprefix(site.url("java")[:-1]): c for url, c in candidates(db).items()}
    assert {p: c["exit_code"] for p, c in cands.items()} == {
        "/": "OK", "/a": "OK", "/b": "OK", "/c": "REDIRECT", "/e": "REDIRECT", "/f": "REDIRECT"}
    assert cands["/c"]["detail"] == cands["/e"]["detail"] == (
        "redirects to itself once normalized, again: not queued")
    assert cands["/f"]["detail"] == "redirects to itself: not queued"
    assert rows(db, "SELECT url FROM redirects") == []
    a_log = rows(db, "SELECT detail FROM crawl_log WHERE url = ? ORDER BY id",
                 site.url("java", "/a"))
    assert [r["detail"] for r in a_log] == [
        "redirects to itself once normalized: its Location asked once more as written", None]
