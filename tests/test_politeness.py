"""Politeness measured on the wire: a recording server logs every request per origin."""

from __future__ import annotations

import itertools
import random
import signal
import socket
import time
from pathlib import Path
from typing import Any

from courtly.config import CrawlConfig
from courtly.robots import RobotsRules
from courtly.robots_cache import INLINE_MATCH
from courtly.scheduler import retry_after_seconds
from courtly.site import Hit, Page, html
from tests.conftest import candidates, courtly, courtly_process, fetched_paths, robots, rows
from tests.hostile_server import (
    Conn,
    HostileServer,
    Request,
    page,
    routes,
    serves_robots,
    silent,
)
from tests.robots_files import hostile_robots, within_bound

SLACK = 0.005


def pages(n: int, name: str = "p", delay: float = 0.0) -> dict[str, Page]:
    site = {"/": Page(html(f"{name} home", [f"/{name}{i}" for i in range(n)]))}
    site |= {f"/{name}{i}": Page(html(f"{name} {i}", ["/"]), delay=delay) for i in range(n)}
    return site


def gaps(hits: list[Hit]) -> list[float]:
    """Time between the end of one request and the arrival of the next, asserting no overlap."""
    out = []
    for before, after in itertools.pairwise(hits):
        assert after.arrived >= before.done, "two requests in flight to one origin"
        out.append(after.arrived - before.done)
    return out


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "crawl.toml"
    path.write_text(text)
    return path


def test_crawl_delay_is_obeyed_and_capped(serve, db: Path, tmp_path: Path) -> None:
    slow = {"/robots.txt": robots("User-agent: *\nCrawl-delay: 0.15\n"), **pages(4, "s")}
    capped = {"/robots.txt": robots("User-agent: *\nCrawl-delay: 100\n"), **pages(4, "c")}
    ours = {"/robots.txt": robots("User-agent: other\nCrawl-delay: 9\n\nUser-agent: courtly\n"
                                  "Crawl-delay: 0.1\nDisallow: /o3\n"), **pages(4, "o")}
    site = serve({"slow": slow, "capped": capped, "ours": ours})
    cfg = config(tmp_path, "[politeness]\nmax_crawl_delay = 0.2\n")
    run = courtly("crawl", *(site.url(n) for n in ("slow", "capped", "ours")), "--db", db,
                  "--min-delay", "0", "--config", cfg)
    assert run.status == 0, run.err
    assert min(gaps(site.hits_for("slow"))) >= 0.15 - SLACK
    assert min(gaps(site.hits_for("capped"))) >= 0.2 - SLACK  # clamped to the cap
    assert max(gaps(site.hits_for("capped"))) < 1.0
    assert min(gaps(site.hits_for("ours"))) >= 0.1 - SLACK  # our group, not 'other'
    assert "/o3" not in fetched_paths(site, "ours")
    assert len(fetched_paths(site, "capped")) == 5


def test_crawl_delay_above_cap_can_skip_the_origin(serve, db: Path, tmp_path: Path) -> None:
    site = serve({"a": {"/robots.txt": robots("User-agent: *\nCrawl-delay: 60\n"), **pages(3)}})
    cfg = config(tmp_path, '[politeness]\nmax_crawl_delay = 1\ncrawl_delay_above_cap = "skip"\n')
    run = courtly("crawl", site.url("a"), "--db", db, "--config", cfg)
    assert run.status == 0, run.err
    assert fetched_paths(site, "a") == []  # only robots.txt was fetched
    home = candidates(db)[site.url("a")]  # given up, with the reason; due again at once
    assert (home["state"], home["exit_code"]) == ("ERROR", "ORIGIN_GIVEN_UP")
    assert home["detail"] == "Crawl-delay 60.0s is above the cap"


def test_retry_after_is_obeyed_and_the_url_crawled_again(serve, db: Path) -> None:
    def limited(count: int) -> Page:
        if count == 0:
            return Page("slow down", 429, {"Retry-After": "1", "Content-Type": "text/plain"})
        return Page(html("finally", []))

    site = serve({"a": {"/": Page(html("Home", ["/limited", "/x", "/y"])), "/limited": limited,
                        "/x": Page(html("X", [])), "/y": Page(html("Y", []))}})
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    hits = site.hits_for("a")
    first_429 = next(i for i, h in enumerate(hits) if h.path == "/limited")
    after = hits[first_429 + 1]
    assert after.arrived - hits[first_429].done >= 1.0 - SLACK
    assert [h.path for h in hits].count("/limited") == 2
    log = rows(db, "SELECT exit_code FROM crawl_log WHERE url = ? ORDER BY id",
               site.url("a", "/limited"))
    assert [r["exit_code"] for r in log] == ["RATE_LIMITED", "OK"]
    assert candidates(db)[site.url("a", "/limited")]["state"] == "CRAWLED"
    assert [r["backoff_until"] for r in rows(db, "SELECT backoff_until FROM origins")] == [0]


def test_a_retry_after_of_unicode_digits_is_ignored_not_a_bug(serve, db: Path) -> None:
    """Retry-After: ² ("².isdigit()", then float("²") raised) was the URL's INTERNAL_ERROR, a
    warning line and lost patience, not a rate limit: delay-seconds are ASCII digits, so the
    value is ignored and the usual backoff applies."""
    def limited(count: int) -> Page:
        if count == 0:
            return Page("slow down", 429, {"Retry-After": "\u00b2", "Content-Type": "text/plain"})
        return Page(html("finally", []))

    site = serve({"a": {"/": Page(html("Home", ["/limited"])), "/limited": limited}})
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    assert "internal error" not in run.err, run.err
    log = rows(db, "SELECT exit_code FROM crawl_log WHERE url = ? ORDER BY id",
               site.url("a", "/limited"))
    assert [r["exit_code"] for r in log] == ["RATE_LIMITED", "OK"]
    assert retry_after_seconds("\u00b2", 0.0) is None
    assert retry_after_seconds("\u0663", 0.0) is None  # ARABIC-INDIC DIGIT THREE
    assert retry_after_seconds(" 7 ", 0.0) == 7.0


def test_a_rate_limit_pause_outlives_a_restart(serve, db: Path) -> None:
    site = serve({"a": {"/": Page("slow down", 429, {"Retry-After": "30",
                                                     "Content-Type": "text/plain"})},
                  "b": {"/": Page(html("b", ["/1", "/2"])), "/1": Page(html("b1", [])),
                        "/2": Page(html("b2", []))}})
    started = time.monotonic()
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--max-actions", "1")
    assert run.status == 0, run.err
    assert time.monotonic() - started < 15  # the budget stops it at once, not after the pause
    log = rows(db, "SELECT exit_code FROM crawl_log")
    assert [r["exit_code"] for r in log] == ["RATE_LIMITED"]
    [origin] = rows(db, "SELECT backoff_until, backoff_level FROM origins")
    assert origin["backoff_until"] > time.time() + 25 and origin["backoff_level"] == 1
    seen = len(site.hits_for("a"))
    # resume the same crawl, with a second origin: once b is crawled, a had its chance too
    proc = courtly_process("crawl", site.url("b"), "--db", db, "--min-delay", "0")
    deadline = time.monotonic() + 20
    while len(site.hits_for("b")) < 4 and time.monotonic() < deadline:  # robots.txt + 3 pages
        time.sleep(0.01)
    assert len(site.hits_for("b")) == 4
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert len(site.hits_for("a")) == seen  # not even robots.txt: the origin is still paused


def test_a_crawl_resumed_at_once_still_waits_the_delay(serve, db: Path) -> None:
    """Each `courtly crawl --max-actions 1` (a script's loop, or a crawl stopped and started
    again) sent its first request as soon as the process was up: a Crawl-delay of 2 s was met
    with requests 0.8 s apart, the time the process took to start. The last request of the
    earlier crawl is not stored, so a resumed origin waits its delay before its first."""
    site = serve({"a": {"/robots.txt": robots("User-agent: *\nCrawl-delay: 2\n"), **pages(5)}})
    for _ in range(3):
        run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0",
                      "--max-actions", "1")
        assert run.status == 0, run.err
    hits = site.hits_for("a")
    assert [h.path for h in hits] == ["/robots.txt", "/", "/p0", "/p1"]
    assert min(gaps(hits)) >= 2.0 - SLACK


def test_503_without_retry_after_backs_off_exponentially(serve, db: Path, tmp_path: Path) -> None:
    def busy(count: int) -> Page:
        if count < 3:
            return Page("busy", 503, {"Content-Type": "text/plain"})
        return Page(html("ok", []))

    site = serve({"a": {"/": busy}})
    cfg = config(tmp_path, "[politeness]\nbackoff_base = 0.1\nmax_retries = 5\n")
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--config", cfg)
    assert run.status == 0, run.err
    waits = gaps(site.hits_for("a")[1:])  # after robots.txt
    assert len(waits) == 3
    assert waits[0] >= 0.1 - SLACK and waits[1] >= 0.2 - SLACK and waits[2] >= 0.4 - SLACK
    assert candidates(db)[site.url("a")]["exit_code"] == "OK"


def test_robots_txt_is_fetched_again_after_expiry(serve, db: Path, tmp_path: Path) -> None:
    site = serve({"a": pages(12, delay=0.05)})
    cfg = config(tmp_path, "[robots]\nexpiry = 0.3\n")
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0.05", "--config", cfg)
    assert run.status == 0, run.err
    hits = site.hits_for("a")
    robots_times = [h.arrived for h in hits if h.path == "/robots.txt"]
    assert len(robots_times) >= 2
    assert all(b - a >= 0.3 - SLACK for a, b in itertools.pairwise(robots_times))
    assert min(gaps(hits)) >= 0.05 - SLACK  # robots.txt requests keep the delay too


def test_robots_5xx_blocks_the_origin_until_it_recovers(serve, db: Path, tmp_path: Path) -> None:
    def flaky(count: int) -> Page:
        if count < 2:
            return Page("oops", 500, {"Content-Type": "text/plain"})
        return robots("User-agent: *\nDisallow: /p1\n")

    site = serve({"a": {"/robots.txt": flaky, **pages(3)}, "b": pages(2, "b")})
    cfg = config(tmp_path, "[politeness]\nbackoff_base = 0.1\n")
    run = courtly("crawl", site.url("a"), site.url("b"), "--db", db, "--min-delay", "0",
                  "--config", cfg)
    assert run.status == 0, run.err
    hits = site.hits_for("a")
    assert [h.path for h in hits[:3]] == ["/robots.txt"] * 3  # nothing else before recovery
    assert set(fetched_paths(site, "a")) == {"/", "/p0", "/p2"}
    assert candidates(db)[site.url("a", "/p1")]["exit_code"] == "BLOCKED_BY_ROBOTS_TXT"
    assert len(fetched_paths(site, "b")) == 3  # the other origin was not held up


def test_robots_unavailable_for_good_gives_up_without_crawling(
    serve, db: Path, tmp_path: Path
) -> None:
    site = serve({"a": {"/robots.txt": Page("down", 503), **pages(2)}})
    cfg = config(tmp_path, "[politeness]\nbackoff_base = 0.01\npatience = 3\n")
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--config", cfg)
    assert run.status == 0, run.err
    assert fetched_paths(site, "a") == []
    assert [h.path for h in site.hits_for("a")] == ["/robots.txt"] * 3
    home = candidates(db)[site.url("a")]
    assert (home["state"], home["exit_code"]) == ("ERROR", "ORIGIN_GIVEN_UP")
    assert home["detail"] == "robots.txt unavailable (status 503)"
    assert rows(db, "SELECT robots_error FROM origins")[0]["robots_error"] == "status 503"
    check = courtly("check", site.url("a", "/p0"), "--db", db).out
    assert "robots.txt: unreachable at the last try (status 503)" in check
    assert "verdict: not crawled yet: robots.txt unreachable" in check
    site.sites["a"]["/robots.txt"] = robots("User-agent: *\nAllow: /\n")
    assert courtly("crawl", "--db", db, "--min-delay", "0").status == 0  # not lost: next run
    assert set(fetched_paths(site, "a")) == {"/", "/p0", "/p1"}
    assert rows(db, "SELECT robots_error FROM origins")[0]["robots_error"] is None  # read again
    assert "robots.txt: allowed" in courtly("check", site.url("a", "/p0"), "--db", db).out


def test_robots_unreachable_later_uses_the_stored_copy_and_says_so(
    serve, db: Path, tmp_path: Path
) -> None:
    site = serve({"a": {"/robots.txt": robots("User-agent: *\nDisallow: /p1\n"), **pages(2)}})
    assert courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0").status == 0
    site.sites["a"]["/robots.txt"] = Page("down", 503)
    site.sites["a"]["/"] = Page(html("home", ["/p0", "/p1", "/new"]))
    site.sites["a"]["/new"] = Page(html("new", []))
    cfg = config(tmp_path, "[robots]\nexpiry = 0.01\n")  # read again, and it fails
    run = courtly("crawl", "--db", db, "--min-delay", "0", "--force-recrawl", "--config", cfg)
    assert run.status == 0, run.err
    assert "/new" in fetched_paths(site, "a") and "/p1" not in fetched_paths(site, "a")
    assert rows(db, "SELECT robots_error FROM origins")[0]["robots_error"] == "status 503"
    out = courtly("check", site.url("a", "/p1"), "--db", db).out
    assert ("robots.txt: disallowed: Disallow: /p1 (group *, line 2) (stored copy; the last "
            "fetch failed: status 503)") in out


def test_a_robots_404_whose_body_fails_still_allows_all(db: Path, tmp_path: Path) -> None:
    """A robots.txt answered 404 whose error page then broke (a Content-Length longer than the
    page, a body that stalls) was 'robots.txt unavailable': disallow all, five requests with
    backoff, and the whole site given up. RFC 9309 reads the status: a 4xx allows all."""
    short = b"HTTP/1.1 404 Not Found\r\nContent-Length: 5000\r\nConnection: close\r\n\r\n<html>"

    async def stalls(conn: Conn, req: Request) -> None:
        await conn.send(short)
        await conn.wait_for_client_close()

    def site(robots: Any, name: str) -> Any:
        return serves_robots(routes({"/robots.txt": robots, "/": page(html(name, ["/a"])),
                                     "/a": page(html(f"{name} a", []))}))

    cfg = config(tmp_path, "[limits]\nfirst_byte_timeout = 1\nread_timeout = 0.5\n"
                           "total_timeout = 2\n")
    with HostileServer({"short": site(short, "short"), "stalls": site(stalls, "stalls")}) as server:
        run = courtly("crawl", server.url("short"), server.url("stalls"), "--db", db,
                      "--min-delay", "0", "--config", cfg)
        assert run.status == 0, run.err
        for name in ("short", "stalls"):
            assert [h.path for h in server.hits_for(name, robots=True)] == [
                "/robots.txt", "/", "/a"], name
    assert {r["exit_code"] for r in rows(db, "SELECT exit_code FROM crawl_log")} == {"OK"}


def test_robots_4xx_allows_all_and_redirects_are_followed(serve, db: Path) -> None:
    site = serve({
        "gone": {"/robots.txt": Page("no", 404), **pages(2, "g")},
        "moved": {"/robots.txt": Page("", 301, {"Location": "/r2"}),
                  "/r2": Page("", 302, {"Location": "/real-robots"}),
                  "/real-robots": robots("User-agent: *\nDisallow: /m1\n"), **pages(2, "m")},
    })
    run = courtly("crawl", site.url("gone"), site.url("moved"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    assert set(fetched_paths(site, "gone")) == {"/", "/g0", "/g1"}
    moved = fetched_paths(site, "moved")
    assert "/m1" not in moved and "/m0" in moved


def test_obey_robots_false_warns_and_crawls_everything(serve, db: Path, tmp_path: Path) -> None:
    site = serve({"a": {"/robots.txt": robots("User-agent: *\nDisallow: /\n"), **pages(2)}})
    cfg = config(tmp_path, "obey_robots = false\n")
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--config", cfg)
    assert run.status == 0
    assert "robots.txt is ignored" in run.err
    assert set(fetched_paths(site, "a")) == {"/", "/p0", "/p1"}
    assert all(h.path != "/robots.txt" for h in site.hits_for("a"))


def test_adaptive_delay_follows_response_times(serve, db: Path, tmp_path: Path) -> None:
    site = serve({"a": pages(5, delay=0.1)})
    cfg = config(tmp_path, "[politeness]\nadaptive_factor = 2.0\n")
    started = time.monotonic()
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--config", cfg)
    assert run.status == 0
    page_hits = [h for h in site.hits_for("a") if h.path != "/robots.txt"]
    # each gap is at least 2 × the mean of the last 5 response times (as the server saw them)
    for i, gap in enumerate(gaps(page_hits)):
        recent = [h.done - h.arrived for h in page_hits[max(0, i - 4): i + 1]]
        assert gap >= 2.0 * sum(recent) / len(recent) - SLACK
    assert max(gaps(page_hits)) >= 0.15
    assert time.monotonic() - started < 10


def test_an_origin_given_up_is_named_in_the_summary(serve, db: Path, tmp_path: Path) -> None:
    site = serve({"a": pages(1)})
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = config(tmp_path, "[politeness]\nbackoff_base = 0.02\n")
    run = courtly("crawl", site.url("a"), f"http://127.0.0.1:{port}/", "--db", db,
                  "--min-delay", "0", "--config", cfg)
    assert run.status == 0, run.err
    assert len(fetched_paths(site, "a")) == 2  # the other origin was crawled
    assert (f"courtly: 1 origin(s) stopped early: http://127.0.0.1:{port}: robots.txt "
            "unavailable (connect: ") in run.err
    check = courtly("check", f"http://127.0.0.1:{port}/", "--db", db).out
    assert "robots.txt: unreachable at the last try (connect: " in check  # kept in the database


def test_robots_redirects_to_another_origin_wait_for_its_turn(serve, db: Path) -> None:
    """Seven origins whose robots.txt redirects to the robots.txt of an eighth origin, itself
    crawled: every request to the eighth (its own and the seven's hops) waits its turn."""
    target: dict[str, str] = {}

    def moved(count: int) -> Page:
        return Page("", 301, {"Location": target["url"]})

    names = [f"r{i}" for i in range(7)]
    sites = {name: {"/robots.txt": moved, "/": Page(html(name, []))} for name in names}
    sites["t"] = {"/robots.txt": robots("User-agent: *\nDisallow: /private\n"),
                  **pages(4, "t")}
    site = serve(sites)
    target["url"] = site.url("t", "/robots.txt")
    run = courtly("crawl", *(site.url(n) for n in [*names, "t"]), "--db", db,
                  "--min-delay", "0.3", "--concurrency", "8")
    assert run.status == 0, run.err
    hits = site.hits_for("t")
    assert len(hits) == 8 + 5  # robots.txt 8 times (its own, the seven hops), 5 pages
    assert min(gaps(hits)) >= 0.3 - SLACK  # one at a time, the delay between them
    for name in names:  # the target's robots.txt applies to each redirecting origin
        assert candidates(db)[site.url(name)]["exit_code"] == "OK"


def test_a_robots_redirect_to_a_disallow_all_file_forbids_the_origin(serve, db: Path) -> None:
    target: dict[str, str] = {}
    site = serve({
        "a": {"/robots.txt": lambda count: Page("", 302, {"Location": target["url"]}),
              "/": Page(html("a", []))},
        "b": {"/robots.txt": robots("User-agent: *\nDisallow: /\n")},
    })
    target["url"] = site.url("b", "/robots.txt")
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    assert candidates(db)[site.url("a")]["exit_code"] == "BLOCKED_BY_ROBOTS_TXT"
    assert [h.path for h in site.hits_for("a")] == ["/robots.txt"]


def test_a_server_failing_every_request_costs_patience_and_backs_off(
    serve, db: Path, tmp_path: Path
) -> None:
    failing = {f"/p{i}": Page("oops", 500, {"Content-Type": "text/plain"}) for i in range(200)}
    site = serve({"down": {"/": Page(html("home", list(failing))), **failing},
                  "fine": pages(3, "f")})
    cfg = config(tmp_path, "[politeness]\nbackoff_base = 0.05\n")
    run = courtly("crawl", site.url("down"), site.url("fine"), "--db", db, "--min-delay", "0",
                  "--config", cfg)
    assert run.status == 0, run.err
    hits = site.hits_for("down")
    assert len(hits) == 2 + 5  # robots.txt, the home page, then patience (5) runs out
    waits = gaps(hits[2:])
    for shorter, longer in itertools.pairwise(waits):  # exponential: each wait doubles (× a
        assert longer >= 1.3 * shorter, waits  # jitter of 1 to 1.5, so at least 2 / 1.5)
    assert waits[0] >= 0.05 - SLACK
    assert "out of patience after HTTP_SERVER_ERROR" in run.err  # the reason, in the summary
    assert len(fetched_paths(site, "fine")) == 4  # the other origin is crawled all the same


def test_an_origin_whose_last_page_fails_finishes_with_patience_left(
    serve, db: Path, tmp_path: Path
) -> None:
    """A failing last page costs patience, then the origin simply runs out of work: it
    finished, it did not stop early (before: "stopped early: out of patience" with 4 left)."""
    site = serve({"a": {"/": Page(html("home", ["/broken"])),
                        "/broken": Page("oops", 500, {"Content-Type": "text/plain"})}})
    cfg = config(tmp_path, "[politeness]\nbackoff_base = 0.05\nmax_retries = 0\n")
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--config", cfg)
    assert run.status == 0, run.err
    assert fetched_paths(site, "a") == ["/", "/broken"]
    assert "finished: no origin has work left" in run.err
    assert "stopped early" not in run.err and "out of patience" not in run.err, run.err
    # found later, on another origin's slow page: its links are crawled (before: refused)
    def slow(count: int) -> Page:  # answers once origin a has run out of work
        return Page(html("slow", [site.url("a", "/later")]), delay=1.5)

    site = serve({"a": {"/": Page(html("home", ["/broken"])),
                        "/broken": Page("oops", 500, {"Content-Type": "text/plain"}),
                        "/later": Page(html("later", []))},
                  "b": {"/": Page(html("b", ["/slow"])), "/slow": slow}})
    run = courtly("crawl", site.url("a"), site.url("b"), "--db", tmp_path / "two.db",
                  "--min-delay", "0", "--config", cfg)
    assert run.status == 0, run.err
    assert fetched_paths(site, "a") == ["/", "/broken", "/later"], run.err


def test_a_success_resets_the_backoff(serve, db: Path, tmp_path: Path) -> None:
    def flaky(count: int) -> Page:
        return Page("oops", 502) if count < 3 else Page(html("ok", []))

    site = serve({"a": {"/": Page(html("home", ["/flaky", "/x1", "/x2"])), "/flaky": flaky,
                        "/x1": Page(html("x1", [])), "/x2": Page(html("x2", []))}})
    cfg = config(tmp_path, "[politeness]\nbackoff_base = 0.05\n")
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--config", cfg)
    assert run.status == 0, run.err
    assert candidates(db)[site.url("a", "/flaky")]["exit_code"] == "HTTP_SERVER_ERROR"
    [origin] = rows(db, "SELECT backoff_level, backoff_until FROM origins")
    assert origin == {"backoff_level": 0, "backoff_until": 0}  # /x1 and /x2 answered after it
    assert {candidates(db)[site.url("a", p)]["exit_code"] for p in ("/x1", "/x2")} == {"OK"}


def test_a_hanging_url_is_requested_three_times_in_all(db: Path, tmp_path: Path) -> None:
    home = page('<a href="/hang">x</a>')
    cfg = config(tmp_path, "[politeness]\nbackoff_base = 0.05\n"
                           "[limits]\nfirst_byte_timeout = 0.3\n")
    with HostileServer({"a": routes({"/": home}, silent)}) as server:
        run = courtly("crawl", server.url("a"), "--db", db, "--min-delay", "0", "--config", cfg)
        assert run.status == 0, run.err
        paths = [h.path for h in server.hits_for("a")]
    assert paths == ["/", "/hang", "/hang", "/hang"]  # the first try and two retries
    assert candidates(db)[server.url("a") + "hang"]["exit_code"] == "TIMEOUT"


def test_a_hostile_robots_txt_does_not_stall_the_other_origins(serve, tmp_path: Path) -> None:
    """Issue 26's robots.txt (10,000 rules of 20 wildcards), 95 rules of 20 wildcards (RE2's DFA
    took up to 0.1 s a new URL) and 30 rules of thousands (judged in a thread), each beside
    URLs of 2,000 octets that keep their rules alive: an origin crawled at the same time keeps
    its pace, and every verdict is the file's."""
    files = {"issue": hostile_robots(), "dfa": hostile_robots(95, 20, allow=False),
             "huge": hostile_robots(30, 8000, allow=False)}
    rnd = random.Random(26)
    links = {name: ["/" + "".join(rnd.choices("abcdef", k=2000)) for _ in range(30)]
             for name in files}
    sites: dict[str, dict[str, Page]] = {"normal": pages(60, "n")}
    for name, body in files.items():
        sites[name] = {"/robots.txt": robots(body.decode()), "/": Page(html(name, links[name]))}
    site = serve(sites)
    # pages analysed on the event loop too (no worker process to wait for at the start)
    cfg = config(tmp_path, "parse_workers = 0\n[robots]\nmax_size = 1048576\n")
    crawls, db = itertools.count(), tmp_path / "crawl.db"

    def largest_gap() -> float:
        """A crawl of its own database: the normal origin's largest gap between requests."""
        nonlocal db
        db, before = tmp_path / f"crawl-{next(crawls)}.db", len(site.hits_for("normal"))
        run = courtly("crawl", *(site.url(name) for name in sites), "--db", db,
                      "--min-delay", "0.05", "--config", cfg)
        assert run.status == 0, run.err
        normal = site.hits_for("normal")[before:]
        assert len(normal) == 62  # robots.txt, the home page, 60 pages
        return max(gaps(normal))

    # the delay, 0.05 s, and no stall (a match on the loop stalled it for seconds), scaled by
    # the machine's slowness: a suite run on a loaded machine saw 0.34 s once
    gap, bound = within_bound(largest_gap, 0.3)
    assert gap < bound, (gap, bound)
    found = candidates(db)
    agent = CrawlConfig().user_agent
    for name, body in files.items():
        rules = RobotsRules.parse(body, agent, 1 << 20)
        assert (rules.match_cost(site.url(name, links[name][0])) > INLINE_MATCH) == (
            name == "huge")  # the one judged off the event loop
        for link in links[name]:
            url = site.url(name, link)
            refused = found[url]["exit_code"] == "BLOCKED_BY_ROBOTS_TXT"
            assert refused != rules.allowed(url), (name, link)
