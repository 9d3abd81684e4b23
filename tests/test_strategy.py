"""End to end: each built-in strategy and a user strategy crawl a local site as documented."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import pytest

from courtly import strategy as strategy_module
from courtly.model import CrawlAction, ExitCode, Link, LinkState
from courtly.site import Page, html
from courtly.store.sqlite import SqliteStore
from courtly.strategy import (
    BUILTIN,
    CrawlingStrategy,
    DomainMetadata,
    MemoryContext,
    StrategyError,
    load_strategy,
)
from tests.conftest import (
    candidates,
    courtly,
    courtly_process,
    fetched_paths,
    move_clock,
    robots,
    rows,
)


def tree() -> dict[str, Page]:
    """/ → a, b, c; a → a/1, a/2; a/1 → a/1/x; b → b/1."""
    return {
        "/": Page(html("Home", ["/a", "/b", "/c"])),
        "/a": Page(html("A", ["/a/1", "/a/2"])),
        "/b": Page(html("B", ["/b/1"])),
        "/c": Page(html("C", [])),
        "/a/1": Page(html("A1", ["/a/1/x"])),
        "/a/2": Page(html("A2", [])),
        "/b/1": Page(html("B1", [])),
        "/a/1/x": Page(html("A1X", [])),
    }


def test_breadth_first_is_the_default(serve, db: Path) -> None:
    site = serve({"a": tree()})
    assert courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0").status == 0
    assert fetched_paths(site, "a") == ["/", "/a", "/b", "/c", "/a/1", "/a/2", "/b/1", "/a/1/x"]


def test_depth_first(serve, db: Path) -> None:
    site = serve({"a": tree()})
    run = courtly(
        "crawl", site.url("a"), "--db", db, "--min-delay", "0", "--strategy", "depth-first"
    )
    assert run.status == 0, run.err
    assert fetched_paths(site, "a") == ["/", "/a", "/a/1", "/a/1/x", "/a/2", "/b", "/b/1", "/c"]


def sitemap(locs: list[str], index: bool = False) -> bytes:
    tag, item = ("sitemapindex", "sitemap") if index else ("urlset", "url")
    entries = "".join(f"<{item}><loc>{loc}</loc></{item}>" for loc in locs)
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>'
        f'<{tag} xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{entries}</{tag}>'
    ).encode()


XML = {"Content-Type": "application/xml"}


def test_discovery_reads_sitemaps_from_robots_and_sitemap_xml(serve, db: Path) -> None:
    """robots.txt's Sitemap lines (a relative one resolved against robots.txt, a repeat read
    once); /sitemap.xml only for an origin whose robots.txt names none."""
    site = serve(
        {
            "a": {
                "/": Page(html("Home", ["/linked"])),
                "/linked": Page(html("Linked", [])),
                "/only-in-sitemap": Page(html("S1", ["/from-sitemap-page"])),
                "/from-sitemap-page": Page(html("S1 child", [])),
                "/gz-page": Page(html("GZ", [])),
                "/conventional": Page(html("Conv", [])),
            },
            "b": {"/": Page(html("B", [])), "/conventional": Page(html("Conv", []))},
        }
    )
    a, b = site.origins["a"], site.origins["b"]
    pages = site.sites["a"]
    pages["/robots.txt"] = robots(
        f"User-agent: *\nAllow: /\nSitemap: /index.xml\nSitemap: {a}/more.xml\n"
        "Sitemap: ./more.xml\n"
    )
    pages["/index.xml"] = Page(
        sitemap([f"{a}/pages.xml.gz", f"{a}/more.xml"], index=True), 200, XML
    )
    pages["/pages.xml.gz"] = Page(
        gzip.compress(sitemap([f"{a}/only-in-sitemap"])),
        200,
        {"Content-Type": "application/x-gzip"},
    )
    pages["/more.xml"] = Page(sitemap([f"{a}/gz-page", "http://elsewhere.invalid/x"]), 200, XML)
    pages["/sitemap.xml"] = Page(sitemap([f"{a}/conventional"]), 200, {"Content-Type": "text/xml"})
    site.sites["b"]["/sitemap.xml"] = Page(sitemap([f"{b}/conventional"]), 200, XML)
    run = courtly("crawl", site.url("a"), site.url("b"), "--db", db, "--min-delay", "0",
                  "--strategy", "discovery")
    assert run.status == 0, run.err
    paths = fetched_paths(site, "a")
    assert sorted(paths) == sorted([
        "/",
        "/linked",
        "/index.xml",
        "/pages.xml.gz",
        "/more.xml",
        "/only-in-sitemap",
        "/from-sitemap-page",
        "/gz-page",
    ])
    assert paths[:3] == ["/", "/index.xml", "/more.xml"]  # the seed, then the sitemaps
    assert fetched_paths(site, "b") == ["/", "/sitemap.xml", "/conventional"]
    cands = candidates(db)
    assert cands[a + "/index.xml"]["exit_code"] == "OK"
    assert cands[a + "/index.xml"]["detail"] == "sitemap index: 2 URLs"
    assert cands[a + "/pages.xml.gz"]["detail"] == "sitemap: 1 URLs"
    assert not any("elsewhere" in url for url in cands)


def test_discovery_reads_feeds_text_and_utf16_sitemaps_and_counts_what_it_drops(
    serve, db: Path
) -> None:
    """RSS, Atom, a text file of URLs and a UTF-16 sitemap are read; entries out of scope or
    not http(s) are counted in the sitemap's detail."""
    names = ["rss", "atom", "text", "utf16"]
    site = serve({"a": {"/": Page(html("Home", []))}
                  | {f"/p-{n}": Page(html(n, [])) for n in names}})
    a, pages = site.origins["a"], site.sites["a"]
    pages["/robots.txt"] = robots("User-agent: *\nAllow: /\nSitemap: /rss\nSitemap: /atom\n"
                                  "Sitemap: /urls.txt\nSitemap: /utf16.xml\n")
    pages["/rss"] = Page(f'<rss version="2.0"><channel><link>{a}/</link><item>'
                         f"<link>{a}/p-rss</link></item></channel></rss>", 200,
                         {"Content-Type": "application/rss+xml"})
    pages["/atom"] = Page('<feed xmlns="http://www.w3.org/2005/Atom"><entry>'
                          f'<link href="{a}/p-atom"/></entry></feed>', 200,
                          {"Content-Type": "application/atom+xml"})
    pages["/urls.txt"] = Page(f"{a}/p-text\nhttp://elsewhere.invalid/x\n", 200,
                              {"Content-Type": "text/plain"})
    utf16 = sitemap([f"{a}/p-utf16", "mailto:x@y"]).decode().replace("UTF-8", "UTF-16")
    pages["/utf16.xml"] = Page(utf16.encode("utf-16"), 200, XML)
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--strategy", "discovery")
    assert run.status == 0, run.err
    assert {f"/p-{n}" for n in names} <= set(fetched_paths(site, "a"))
    cands = candidates(db)
    assert cands[a + "/rss"]["detail"] == "RSS feed: 1 URLs"
    assert cands[a + "/atom"]["detail"] == "Atom feed: 1 URLs"
    dropped = ", 1 not followed (out of scope or not http(s))"
    assert cands[a + "/urls.txt"]["detail"] == "text sitemap: 2 URLs" + dropped
    assert cands[a + "/utf16.xml"]["detail"] == "sitemap: 2 URLs" + dropped


def test_a_plain_sitemap_may_have_the_protocols_50_mb_a_page_max_body_size(
    serve, db: Path
) -> None:
    """A 12 MiB sitemap served uncompressed is read (before: TOO_LARGE over max_body_size,
    10 MiB); a 12 MiB page is still TOO_LARGE."""
    big = 12 << 20
    site = serve({"a": {"/": Page(html("Home", ["/big-page"])), "/listed": Page(html("L", [])),
                        "/big-page": Page(b"<html>" + b" " * big)}})
    a, pages = site.origins["a"], site.sites["a"]
    pages["/robots.txt"] = robots("User-agent: *\nAllow: /\nSitemap: /big.xml\n")
    padded = sitemap([f"{a}/listed"]).replace(b"<url>", b" " * big + b"<url>")
    pages["/big.xml"] = Page(padded, 200, XML)
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--strategy", "discovery")
    assert run.status == 0, run.err
    cands = candidates(db)
    assert cands[a + "/big.xml"]["detail"] == "sitemap: 1 URLs"
    assert cands[a + "/listed"]["exit_code"] == "OK"
    assert cands[a + "/big-page"]["exit_code"] == "TOO_LARGE"


def test_discovery_caps_new_urls_per_origin_across_runs(serve, db: Path, tmp_path: Path) -> None:
    pages = {"/": Page(html("Home", [f"/p{i}" for i in range(20)]))}
    pages |= {f"/p{i}": Page(html(f"P{i}", [f"/p{i}/deeper"])) for i in range(20)}
    site = serve({"a": pages})
    config = tmp_path / "crawl.toml"
    config.write_text('strategy = "discovery"\n[strategy_args]\nmax_pages_per_origin = 5\n')
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--config", config)
    assert run.status == 0, run.err
    a = site.origins["a"]
    pages_crawled = [p for p in fetched_paths(site, "a") if not p.endswith(".xml")]
    assert pages_crawled == ["/", "/p0", "/p1", "/p2", "/p3"]  # the seed + 4 links
    meta = json.loads(rows(db, "SELECT metadata FROM origins WHERE origin = ?", a)[0]["metadata"])
    assert meta == {"discovered": 5, "capped": True}
    # the cap is domain metadata: it persists, so a new seed on a later run is not admitted
    again = courtly("crawl", a + "/p9", "--db", db, "--min-delay", "0", "--config", config)
    assert again.status == 0
    assert a + "/p9" not in {u for u, c in candidates(db).items() if c["state"] == "CRAWLED"}


def test_recrawl_only_adds_nothing(serve, db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = serve({"a": {"/": Page(html("Home", ["/x"])), "/x": Page(html("X", []))}})
    assert courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0").status == 0
    site.sites["a"]["/"] = Page(html("Home", ["/x", "/new"]))  # type: ignore[index]
    move_clock(monkeypatch, 8 * 86400)
    run = courtly("crawl", "--db", db, "--min-delay", "0", "--strategy", "recrawl-only")
    assert run.status == 0, run.err
    assert fetched_paths(site, "a") == ["/", "/x", "/", "/x"]
    assert site.url("a", "/new") not in candidates(db)


def anchors(title: str, links: dict[str, str]) -> str:
    body = "".join(f'<a href="{href}">{text}</a> ' for href, text in links.items())
    return f"<!doctype html><html><head><title>{title}</title></head><body>{body}</body></html>"


def topical_site() -> dict[str, Page]:
    return {
        "/": Page(
            anchors(
                "Home",
                {
                    "/cook": "Cooking",
                    "/py1": "Python tips",
                    "/garden": "Gardening",
                    "/py2": "More python",
                    "/skipme": "skip this python page",
                },
            )
        ),
        "/py1": Page(anchors("Py1", {"/py3": "Python news", "/knit": "Knitting"})),
        "/py2": Page(anchors("Py2", {})),
        "/py3": Page(anchors("Py3", {})),
        "/cook": Page(anchors("Cook", {})),
        "/garden": Page(anchors("Garden", {})),
        "/knit": Page(anchors("Knit", {})),
        "/skipme": Page(anchors("Skip", {})),
    }


USER = "tests.test_strategy_user:Topical"


def test_user_strategy_by_module_and_class(serve, db: Path) -> None:
    site = serve({"a": topical_site()})
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--strategy", USER)
    assert run.status == 0, run.err
    assert fetched_paths(site, "a") == ["/", "/py1", "/py2", "/py3", "/cook", "/garden", "/knit"]
    cands = candidates(db)
    assert cands[site.url("a", "/py1")]["score"] == 0.9
    assert cands[site.url("a", "/cook")]["score"] == 0.1
    assert site.url("a", "/skipme") not in cands  # filter_extracted_links dropped it
    meta = json.loads(rows(db, "SELECT metadata FROM origins")[0]["metadata"])
    assert meta == {"seeded": 1, "pages": 7}


def test_user_strategy_goal_and_config_args(serve, db: Path, tmp_path: Path) -> None:
    site = serve({"a": topical_site()})
    config = tmp_path / "crawl.toml"
    config.write_text(f'strategy = "{USER}"\n[strategy_args]\ngoal = 2\nkeywords = ["python"]\n')
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--config", config)
    assert run.status == 0, run.err
    assert fetched_paths(site, "a") == ["/", "/py1", "/py2"]


def test_add_seeds_goes_through_read_seeds_without_crawling(serve, db: Path) -> None:
    site = serve({"a": topical_site()})
    seed = site.url("a")
    first = courtly("add-seeds", seed, "--db", db, "--strategy", USER)
    assert first.status == 0, first.err
    assert "1 new crawl candidates" in first.out
    assert site.hits == []  # nothing fetched
    assert candidates(db)[seed]["state"] == "NOT_CRAWLED"
    meta = json.loads(rows(db, "SELECT metadata, configured FROM origins")[0]["metadata"])
    assert meta == {"seeded": 1}
    run = courtly("crawl", "--db", db, "--min-delay", "0", "--strategy", USER)
    assert run.status == 0 and fetched_paths(site, "a")[0] == "/"
    # the strategy sees the seed was crawled (refresh_states) and does not schedule it again
    again = courtly("add-seeds", seed, "--db", db, "--strategy", USER)
    assert "0 new crawl candidates" in again.out
    meta = json.loads(rows(db, "SELECT metadata FROM origins")[0]["metadata"])
    assert meta["seeded"] == 1


def test_add_seeds_from_a_file_with_the_default_strategy(serve, db: Path, tmp_path: Path) -> None:
    site = serve({"a": tree()})
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(f"# seeds\n{site.url('a')}\n{site.url('a', '/c')}\n")
    run = courtly("add-seeds", "--seeds-file", seeds, "--db", db)
    assert run.status == 0 and "2 new crawl candidates" in run.out
    assert {c["state"] for c in candidates(db).values()} == {"NOT_CRAWLED"}
    assert site.hits == []


def test_unknown_or_bad_user_strategy_is_one_line(db: Path) -> None:
    for spec, words in [
        ("no_such_module:X", "cannot load strategy"),
        ("tests.test_strategy_user:Nope", "cannot load strategy"),
        ("tests.test_strategy_user:LinkState", "not a courtly.strategy"),
        ("bogus", "unknown strategy"),
    ]:
        run = courtly("add-seeds", "http://127.0.0.1:1/", "--db", db, "--strategy", spec)
        assert run.status == 2 and words in run.err, (spec, run.err)
        assert len(run.err.strip().splitlines()) == 1


# -- the API on its own -------------------------------------------------------------------


def test_builtins_and_load_strategy() -> None:
    assert set(BUILTIN) == {"breadth-first", "depth-first", "discovery", "recrawl-only"}
    assert load_strategy("discovery", args={"max_pages_per_origin": 3}).cap == 3  # type: ignore[attr-defined]
    with pytest.raises(StrategyError):
        load_strategy(":X")


def test_refresh_states_and_domain_metadata_in_memory() -> None:
    context = MemoryContext()
    context.link_states["http://a/x"] = LinkState.CRAWLED
    strategy = CrawlingStrategy(context)
    requests = [strategy.create_request("http://a/x"), strategy.create_request("http://a/y")]
    assert [r.state for r in requests] == [None, None]
    strategy.refresh_states(requests)
    assert [r.state for r in requests] == [LinkState.CRAWLED, LinkState.NOT_CRAWLED]
    strategy.domain_metadata["http://a"]["n"] = 1
    assert "http://a" not in context.metadata  # saved on flush/close, not before
    strategy.close()
    assert context.metadata == {"http://a": {"n": 1}}
    assert strategy.domain_metadata.flush() == 0  # unchanged: nothing written
    strategy.links_extracted(requests[0], requests)
    assert [s.request.url for s in strategy.take_scheduled()] == ["http://a/y"]


def test_saving_domain_metadata_costs_what_the_strategy_used_not_every_origin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With 2,000 origins held, a crawl action's save encodes the origin used and a few others
    in turn (before: all 2,000, 8 ms an action on a 2-core machine)."""
    metadata = CrawlingStrategy(MemoryContext()).domain_metadata
    origins = [f"http://h{i}" for i in range(2000)]
    for origin in origins:
        metadata[origin]["n"] = 0
    assert metadata.flush() == 2000
    encoded: list[dict[str, object]] = []
    monkeypatch.setattr(strategy_module, "_snapshot",
                        lambda data: encoded.append(data) or json.dumps(data, sort_keys=True))
    metadata[origins[5]]["n"] += 1
    assert metadata.changed() == {origins[5]: {"n": 1}}
    assert 1 <= len(encoded) <= 1 + DomainMetadata.SWEEP


def test_domain_metadata_kept_elsewhere_and_changed_later_is_saved_in_turn_and_on_close() -> None:
    context = MemoryContext()
    strategy = CrawlingStrategy(context)
    origins = [f"http://h{i}" for i in range(100)]
    kept = [strategy.domain_metadata[origin] for origin in origins]
    assert strategy.domain_metadata.flush() == 0
    kept[0]["late"] = True  # not through domain_metadata[...]: no save knows it was used
    for _ in range(len(origins) // DomainMetadata.SWEEP + 1):
        if changed := strategy.domain_metadata.changed():
            break
    assert changed == {origins[0]: {"late": True}}
    kept[1]["late"] = True
    strategy.close()
    assert context.metadata[origins[1]] == {"late": True}


def test_frontier_queries_use_indexes_not_scans(tmp_path: Path) -> None:
    """Every query that picks work reads an index: no scan of the candidates table."""
    store = SqliteStore(str(tmp_path / "plan.db"))
    signature = bytes(range(256))
    store.add_links([Link("http://a/x", "http://a", 0)])
    crawled = store.take_todo("http://a", 1, 1, 0.0)[0]
    assert store.find_similar(signature, crawled.url, 0.8) is None  # the filters read, once
    action = CrawlAction(crawled, "http://a", ExitCode.OK, 0.0)
    action.near_signature = signature
    store.record(action, 1)  # its band keys: the filters hold them, the lookup below probes
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    store.take_todo("http://a", 1, 10, 1e12)
    store.states(["http://a/x", "http://a/y"])
    assert store.find_similar(signature, "http://a/y", 0.8) == ("http://a/x", 1.0)
    store.find_hash("abc", "http://a/x")
    selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(selects) >= 6
    con = sqlite3.connect(str(tmp_path / "plan.db"))
    for sql in selects:
        plan = " | ".join(r[3] for r in con.execute("EXPLAIN QUERY PLAN " + sql))
        # "SCAN hits" reads the few candidate ids the index gave (a materialized subquery)
        for table in ("c", "k", "n", "candidates", "near_dup_keys", "near_dup"):
            assert f"SCAN {table} " not in plan + " ", (sql, plan)
        assert "USING" in plan, (sql, plan)
    con.close()
    store.close()


def woven() -> dict[str, Page]:
    """tree() with links back up and across: known, crawled and fresh links on each page."""
    pages = tree()
    pages["/a/1"] = Page(html("A1", ["/a/1/x", "/", "/b", "/a/2", "/c/z"]))
    pages["/b"] = Page(html("B", ["/b/1", "/a", "/a/1", "/"]))
    pages["/c/z"] = Page(html("CZ", ["/a/1/x", "/b/1"]))
    return pages


def test_base_link_handlers_are_computed_directly_with_the_same_result(
    serve, db: Path, tmp_path: Path
) -> None:
    site = serve({"a": woven()})
    generic = tmp_path / "generic.db"
    assert courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0").status == 0
    direct_order = fetched_paths(site, "a")
    site.hits.clear()
    run = courtly("crawl", site.url("a"), "--db", generic, "--min-delay", "0",
                  "--strategy", "tests.test_strategy_user:GenericBreadthFirst")
    assert run.status == 0, run.err
    assert fetched_paths(site, "a") == direct_order
    assert len(direct_order) == 9
    keep = ("state", "depth", "score", "exit_code")
    assert {u: [c[k] for k in keep] for u, c in candidates(db).items()} == {
        u: [c[k] for k in keep] for u, c in candidates(generic).items()}


def test_which_strategies_take_the_direct_link_path() -> None:
    from tests.test_strategy_user import ExtraFromPageCrawled, GenericBreadthFirst, Topical

    assert BUILTIN["breadth-first"]().has_base_link_handlers()
    assert ExtraFromPageCrawled().has_base_link_handlers()
    for cls in (GenericBreadthFirst, Topical, *(BUILTIN[n] for n in ("depth-first", "discovery",
                                                                    "recrawl-only"))):
        assert not cls().has_base_link_handlers(), cls
    patched = CrawlingStrategy()
    patched.links_extracted = lambda request, links: None  # type: ignore[method-assign]
    assert not patched.has_base_link_handlers()


def test_the_direct_link_path_keeps_what_page_crawled_scheduled(serve, db: Path) -> None:
    pages = tree()
    pages["/extra"] = Page(html("Extra", []))
    site = serve({"a": pages})
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0",
                  "--strategy", "tests.test_strategy_user:ExtraFromPageCrawled")
    assert run.status == 0, run.err
    assert "/extra" in fetched_paths(site, "a")
    assert candidates(db)[site.url("a", "/extra")]["score"] == 0.2


def test_a_strategy_bug_on_one_page_is_an_exit_code_and_the_crawl_goes_on(serve,
                                                                         db: Path) -> None:
    site = serve({"a": {"/": Page(html("Home", ["/boom", "/after"])),
                        "/boom": Page(html("Boom", [])), "/after": Page(html("After", []))}})
    proc = courtly_process("crawl", site.url("a"), "--db", db, "--min-delay", "0",
                           "--strategy", "tests.test_strategy_user:RaisesOnOnePage")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert f"internal error on {site.url('a', '/boom')}: ValueError: no boom allowed" in err
    assert "(2 OK, 1 errors)" in err
    cands = candidates(db)
    boom = cands[site.url("a", "/boom")]
    assert (boom["state"], boom["exit_code"]) == ("ERROR", "INTERNAL_ERROR")
    assert boom["detail"].startswith("ValueError: no boom allowed (at test_strategy_user.py:")
    assert cands[site.url("a", "/after")]["exit_code"] == "OK"


def test_a_strategy_bug_between_pages_stops_the_crawl_in_one_line(serve, db: Path) -> None:
    site = serve({"a": {"/": Page(html("Home", ["/next"])), "/next": Page(html("Next", []))}})
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0",
                  "--strategy", "tests.test_strategy_user:RaisesWhenAskedIfFinished")
    assert run.status == 1
    assert "Traceback" not in run.err
    assert "internal error: RuntimeError: cannot tell (at test_strategy_user.py:" in run.err
    assert fetched_paths(site, "a") == ["/"]  # stopped after the first action
    assert candidates(db)[site.url("a")]["exit_code"] == "OK"  # which was recorded
