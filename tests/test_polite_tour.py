"""Politeness as a site owner sees it in the access log: servers that rate limit, fail and
misbehave as real ones do, each request's start and end recorded on the server's side."""

from __future__ import annotations

import itertools
from pathlib import Path

from courtly.site import Page, html
from tests.conftest import candidates, courtly, courtly_process, robots, rows
from tests.test_politeness import config, gaps

BUSY = Page("busy", 503, {"Content-Type": "text/plain"})


def test_a_server_503_for_an_hour_sees_the_backoff_grow(serve, db: Path, tmp_path: Path) -> None:
    """A pause longer than `backoff_forgive_after` counted as the quiet time that forgives the
    backoff: a server answering 503 to every request saw the waits grow to that length, then
    fall back to `backoff_base` and grow again, for as long as it stayed down. The quiet time
    now starts when the pause ends."""
    site = serve({"a": {"/": BUSY}})
    cfg = config(tmp_path, "[politeness]\nbackoff_base = 0.1\nbackoff_forgive_after = 0.3\n"
                           "max_retries = 4\n")
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--config", cfg)
    assert run.status == 0, run.err
    waits = gaps(site.hits_for("a")[1:])  # after robots.txt
    assert len(waits) == 4
    for shorter, longer in itertools.pairwise(waits):  # doubling, × a jitter of 1 to 1.5
        assert longer >= 1.3 * shorter, waits


def test_a_server_503_for_an_hour_is_given_up_with_one_line(
    serve, db: Path, tmp_path: Path
) -> None:
    """A 503 cost no patience and gave it back: a site down for maintenance, with 40 URLs
    known, was asked for each of them three times, the waits growing to backoff_max (5 min):
    120 requests over about 10 hours before the crawl could end. Now a rate limit that follows
    another, with no answer between, costs a point: six 503s in a row and the origin is given
    up for the run, named in one line."""
    down = {f"/p{i}": BUSY for i in range(40)}
    site = serve({"a": {"/": Page(html("home", list(down))), **down}})
    cfg = config(tmp_path, "[politeness]\nbackoff_base = 0.01\n")
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--config", cfg)
    assert run.status == 0, run.err
    assert len(site.hits_for("a")) == 2 + 6  # robots.txt, the home page, six 503s
    assert "stopped early" in run.err and "out of patience after RATE_LIMITED" in run.err
    given_up = [c for c in candidates(db).values() if c["exit_code"] == "ORIGIN_GIVEN_UP"]
    assert len(given_up) >= 34  # due again at once: the next run takes them


def test_a_retry_after_of_a_day_is_capped_and_says_so(serve, db: Path, tmp_path: Path) -> None:
    """Retry-After: 86400 paused the origin for `retry_after_cap` with the detail "paused
    600.0s", as if the server had asked for that: now the detail names the day it asked for."""
    def busy(count: int) -> Page:
        if count == 0:
            return Page("later", 429, {"Retry-After": "86400", "Content-Type": "text/plain"})
        return Page(html("ok", []))

    site = serve({"a": {"/": busy}})
    cfg = config(tmp_path, "[politeness]\nretry_after_cap = 0.5\n")
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--config", cfg)
    assert run.status == 0, run.err
    hits = site.hits_for("a")
    assert [h.path for h in hits] == ["/robots.txt", "/", "/"]
    assert 0.5 <= hits[2].arrived - hits[1].done < 5
    [limited, ok] = rows(db, "SELECT exit_code, detail FROM crawl_log ORDER BY id")
    assert limited == {"exit_code": "RATE_LIMITED",
                       "detail": "paused 0.5s (Retry-After 86400s capped)"}
    assert ok["exit_code"] == "OK"


def test_a_crawl_delay_above_the_cap_is_named_in_the_last_lines(serve, db: Path,
                                                                tmp_path: Path) -> None:
    """`Crawl-delay: 3600` was clamped to max_crawl_delay without a word: the user saw a site
    crawled at one page every cap's seconds and could not tell why."""
    site = serve({"a": {"/robots.txt": robots("User-agent: *\nCrawl-delay: 3600\n"),
                        "/": Page(html("Home", ["/b"])), "/b": Page(html("B", []))},
                  "b": {"/": Page(html("Other", []))}})
    run = courtly("crawl", site.url("a"), site.url("b"), "--db", db, "--min-delay", "0",
                  "--config", config(tmp_path, "[politeness]\nmax_crawl_delay = 0.2\n"))
    assert run.status == 0, run.err
    assert (f"courtly: 1 origin(s) asked a Crawl-delay above max_crawl_delay 0.2s, crawled "
            f"at that delay: {site.origins['a']}: Crawl-delay 3600") in run.err


def test_a_robots_expiry_shorter_than_the_delay_still_crawls(serve, db: Path,
                                                            tmp_path: Path) -> None:
    """`[robots] expiry` below the origin's delay: robots.txt had expired again whenever the
    origin's turn came, so every turn fetched it and no page ever was (a livelock)."""
    site = serve({"a": {"/robots.txt": robots("User-agent: *\nAllow: /\n"),
                        "/": Page(html("Home", ["/b"])), "/b": Page(html("B", []))}})
    proc = courtly_process("crawl", site.url("a"), "--db", db, "--min-delay", "0.3",
                           "--config", config(tmp_path, "[robots]\nexpiry = 0.1\n"))
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    paths = [h.path for h in site.hits_for("a")]
    assert sorted(set(paths)) == ["/", "/b", "/robots.txt"], paths
    assert paths.count("/robots.txt") <= 3, paths  # at most one a page: the delay runs
