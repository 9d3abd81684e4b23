"""A crawl with policies and trap guards: refused URLs are logged with their exit code and rule."""

from __future__ import annotations

from pathlib import Path

from courtly.site import Page, html
from tests.conftest import candidates, courtly, fetched_paths, rows


def test_policies_and_traps_show_exit_codes_and_reasons(serve, db: Path, tmp_path: Path) -> None:
    links = ["/private/a", "/search?q=x", "/search?q=x&page=2", "/search?q=x&sort=asc",
             "/a/b/c/d/e/f", "/cal/cal/cal/x", "/ok?utm_source=news&id=1",
             "/file.pdf", "/tmp/x"]
    site = serve({"a": {"/": Page(html("Home", links)),
                        **{p: Page(html(p, [])) for p in ("/search?q=x", "/search?page=2&q=x",
                                                          "/ok?id=1")}}})
    config = tmp_path / "crawl.toml"
    config.write_text(
        '[policies]\ndo_not_crawl = ["/private/", "glob:*.pdf"]\ndeny = ["re:/tmp/"]\n'
        'url_query_parameters = [{ path_prefix = "/search", allow = [["q"], ["q", "page"]] }]\n'
        "[traps]\nmax_path_depth = 4\nmax_segment_repeats = 2\n"
    )
    run = courtly("crawl", site.url("a"), "--db", db, "--config", config, "--min-delay", "0")
    assert run.status == 0, run.err
    cands = candidates(db)

    def outcome(path: str) -> tuple[str, str]:
        record = cands[site.url("a", path)]
        return record["exit_code"], record["detail"]

    blocked = "BLOCKED_URL_BY_LOCAL_POLICY"
    assert outcome("/private/a") == (blocked, "do_not_crawl: /private/")
    assert outcome("/file.pdf") == (blocked, "do_not_crawl: glob:*.pdf")
    assert outcome("/tmp/x") == (blocked, "deny: re:/tmp/")
    code, rule = outcome("/search?q=x&sort=asc")
    assert code == blocked and rule.startswith("url_query_parameters: /search allows")
    assert outcome("/a/b/c/d/e/f") == (blocked, "trap: max_path_depth 4")
    assert outcome("/cal/cal/cal/x") == (blocked, "trap: max_segment_repeats 2")
    assert outcome("/search?q=x")[0] == "OK"
    assert outcome("/search?page=2&q=x")[0] == "OK"  # the query was sorted
    assert outcome("/ok?id=1")[0] == "OK"  # utm_source removed
    assert set(fetched_paths(site, "a")) == {"/", "/search?q=x", "/search?page=2&q=x", "/ok?id=1"}
    stats = courtly("stats", "--db", db)
    assert blocked in stats.out


def test_max_pages_per_origin_finishes_the_origin_for_the_run(serve, db: Path,
                                                             tmp_path: Path) -> None:
    site = serve({"a": {"/": Page(html("Home", [f"/p{i}" for i in range(6)])),
                        **{f"/p{i}": Page(html(f"p{i}", [])) for i in range(6)}}})
    config = tmp_path / "crawl.toml"
    config.write_text("[traps]\nmax_pages_per_origin = 3\n")
    for run_number in (1, 2):  # the cap counts the pages of each run
        run = courtly("crawl", site.url("a"), "--db", db, "--config", config,
                      "--min-delay", "0")
        assert run.status == 0, run.err
        assert len(fetched_paths(site, "a")) == 3 * run_number
    codes = [c["exit_code"] for c in candidates(db).values()]
    # the one URL left was given up with the origin, with the reason, for the next run
    assert codes.count("OK") == 6 and codes.count("ORIGIN_GIVEN_UP") == 1
    [left] = [c for c in candidates(db).values() if c["exit_code"] == "ORIGIN_GIVEN_UP"]
    assert left["detail"] == "trap: max_pages_per_origin 3"


def test_the_summary_counts_every_crawl_action_logged(serve, db: Path, tmp_path: Path) -> None:
    """The last lines' "N actions" left out the URLs of an origin given up (ORIGIN_GIVEN_UP),
    which the crawl log, the exit codes line and the live view count."""
    site = serve({"a": {"/": Page(html("Home", [f"/p{i}" for i in range(6)])),
                        **{f"/p{i}": Page(html(f"p{i}", [])) for i in range(6)}}})
    config = tmp_path / "crawl.toml"
    config.write_text("[traps]\nmax_pages_per_origin = 3\n")
    run = courtly("crawl", site.url("a"), "--db", db, "--config", config, "--min-delay", "0")
    assert run.status == 0, run.err
    logged = len(rows(db, "SELECT id FROM crawl_log"))
    assert logged > 3
    assert f"{logged} actions (3 OK, 0 errors)" in run.err
