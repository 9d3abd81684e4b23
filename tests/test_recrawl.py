"""Recrawl: next-due times, adaptive intervals, conditional GET; time moved forward by the clock."""

from __future__ import annotations

import time
from email.utils import formatdate
from pathlib import Path

import pytest
import zstandard

from courtly.config import Recrawl, Robots
from courtly.model import Candidate, CrawlAction, ExitCode
from courtly.recrawl import interval, next_due
from courtly.site import Page, html
from tests.conftest import (
    candidates,
    courtly,
    courtly_process,
    fetched_paths,
    move_clock,
    robots,
    rows,
    time_moved,
)

DAY = 86400.0
HTML = "text/html"
LAST_MODIFIED = "Wed, 21 Oct 2015 07:28:00 GMT"


def recrawl_site() -> dict[str, object]:
    def same(count: int) -> Page:  # answers 304 once it has been fetched
        if count == 0:
            return Page(html("Same", []), headers={"Content-Type": HTML, "ETag": '"v1"'})
        return Page(b"", 304, {"ETag": '"v1"'})

    def dated(count: int) -> Page:  # validators: Last-Modified only
        if count == 0:
            return Page(
                html("Dated", []), headers={"Content-Type": HTML, "Last-Modified": LAST_MODIFIED}
            )
        return Page(b"", 304, {})

    def changing(count: int) -> Page:  # new content on every fetch
        return Page(html(f"Changing {count}", []), headers={"Content-Type": HTML})

    return {
        "/": Page(html("Home", ["/same", "/dated", "/changing", "/gone"])),
        "/same": same,
        "/dated": dated,
        "/changing": changing,
        "/gone": Page("broken", 500, {"Content-Type": "text/plain"}),
    }


def crawl_at(offset_days: float, *args: object) -> None:
    """Run `courtly crawl` as a real process with its clock moved forward."""
    proc = courtly_process("crawl", *args, env=time_moved(offset_days * DAY))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err


def intervals(db: Path, origin: str) -> dict[str, float]:
    return {
        r["url"].removeprefix(origin): r["recrawl_interval"]
        for r in rows(db, "SELECT url, recrawl_interval FROM candidates")
    }


def test_second_run_recrawls_what_is_due_with_conditional_requests(serve, db: Path) -> None:
    site = serve({"a": recrawl_site()})
    a = site.origins["a"]
    assert courtly("crawl", a + "/", "--db", db, "--min-delay", "0").status == 0
    assert sorted(fetched_paths(site, "a")) == ["/", "/changing", "/dated", "/gone", "/same"]
    first = intervals(db, a)
    assert first == {
        "/": 7 * DAY,
        "/same": 7 * DAY,
        "/dated": 7 * DAY,
        "/changing": 7 * DAY,
        "/gone": 1 * DAY,
    }

    # nothing is due yet: a second run right away fetches nothing
    assert courtly("crawl", "--db", db, "--min-delay", "0").status == 0
    assert len(fetched_paths(site, "a")) == 5

    crawl_at(8, "--db", db, "--min-delay", "0")
    second = site.hits_for("a")[-5:]
    assert sorted(h.path for h in second) == ["/", "/changing", "/dated", "/gone", "/same"]
    headers = {h.path: h.headers for h in second}
    assert headers["/same"]["If-None-Match"] == '"v1"'
    assert headers["/dated"]["If-Modified-Since"] == LAST_MODIFIED
    assert "If-None-Match" not in headers["/changing"]

    cands = candidates(db)
    assert cands[a + "/same"]["exit_code"] == "NOT_MODIFIED"
    assert cands[a + "/dated"]["exit_code"] == "NOT_MODIFIED"
    assert cands[a + "/same"]["etag"] == '"v1"'
    log = rows(db, "SELECT exit_code FROM crawl_log WHERE url = ? ORDER BY id", a + "/same")
    assert [r["exit_code"] for r in log] == ["OK", "NOT_MODIFIED"]
    stored = rows(db, "SELECT body FROM content WHERE url = ?", a + "/same")[0]["body"]
    assert zstandard.ZstdDecompressor().decompress(stored) == html("Same", []).encode()

    # adaptive: unchanged pages wait longer, the changed one less, the error backs off
    assert intervals(db, a) == {
        "/": 10.5 * DAY,
        "/same": 10.5 * DAY,
        "/dated": 10.5 * DAY,
        "/changing": 3.5 * DAY,
        "/gone": 2 * DAY,
    }

    # at +12 days only what is due is crawled: /gone (due +10) and /changing (+11.5)
    before = len(site.hits_for("a"))
    crawl_at(12, "--db", db, "--min-delay", "0")
    third = [h.path for h in site.hits_for("a")[before:] if h.path != "/robots.txt"]
    assert third == ["/gone", "/changing"]
    assert intervals(db, a)["/changing"] == 1.75 * DAY


TEXT = " ".join(f"word{i}" for i in range(200))  # well over dedup.min_words


def restless_site() -> dict[str, object]:
    """A page whose body changes on every request only in a time and a token, one whose text
    changes every time, and a file whose bytes change by one."""
    def stamped(count: int) -> Page:
        stamp = f"generated at {time.time():.6f} token {count}"
        return Page(html("Stamped", [], body=f"{TEXT} {stamp}"), headers={"Content-Type": HTML})

    def rewritten(count: int) -> Page:
        words = " ".join(f"v{count}w{i}" for i in range(200))
        return Page(html("Rewritten", [], body=words), headers={"Content-Type": HTML})

    def file(count: int) -> Page:
        return Page(f"{TEXT} {count}", headers={"Content-Type": "text/plain"})

    return {"/": Page(html("Home", ["/stamped", "/rewritten", "/file"])), "/stamped": stamped,
            "/rewritten": rewritten, "/file": file}


@pytest.mark.parametrize(
    "db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_a_page_near_its_last_version_is_unchanged_and_its_interval_grows(
    serve, db: Path
) -> None:
    site = serve({"a": restless_site()})
    a = site.origins["a"]
    assert courtly("crawl", a + "/", "--db", db, "--min-delay", "0").status == 0
    seen = [intervals(db, a)]
    for _ in range(2):
        assert courtly("crawl", "--db", db, "--min-delay", "0", "--force-recrawl").status == 0
        seen.append(intervals(db, a))
    # only a time and a token changed: unchanged, the interval grows (it shrank to 1.75 days)
    assert [s["/stamped"] for s in seen] == [7 * DAY, 10.5 * DAY, 15.75 * DAY]
    # new text, or a file's new bytes (its exact fingerprint decides): changed, it shrinks
    assert [s["/rewritten"] for s in seen] == [7 * DAY, 3.5 * DAY, 1.75 * DAY]
    assert [s["/file"] for s in seen] == [7 * DAY, 3.5 * DAY, 1.75 * DAY]
    # the new body is kept all the same, as the page's content (no duplicate of itself)
    cands = candidates(db)
    assert cands[a + "/stamped"]["exit_code"] == "OK"
    stored = rows(db, "SELECT body FROM content WHERE url = ?", a + "/stamped")[0]["body"]
    assert b"token 2" in zstandard.ZstdDecompressor().decompress(bytes(stored))


def drifting_site() -> dict[str, object]:
    """A page whose text changes by 8 more of its 300 words on every visit (a few shingles: each
    version is a near-duplicate of the one before)."""
    def drifting(count: int) -> Page:
        words = " ".join(f"new{i}" if i < 8 * count else f"word{i}" for i in range(300))
        return Page(html("Drifting", [], body=words), headers={"Content-Type": HTML})

    return {"/": Page(html("Home", ["/drifting"])), "/drifting": drifting}


@pytest.mark.parametrize(
    "db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_a_page_drifting_by_small_edits_is_changed_once_far_from_its_last_changed_version(
    serve, db: Path
) -> None:
    """Each visit is near the one before, but the 4th has drifted below dedup.min_similarity
    from the first: changed (its interval shrinks), and the next visits are compared with it."""
    site = serve({"a": drifting_site()})
    a = site.origins["a"]
    assert courtly("crawl", a + "/", "--db", db, "--min-delay", "0").status == 0
    seen = [intervals(db, a)["/drifting"]]
    for _ in range(5):
        assert courtly("crawl", "--db", db, "--min-delay", "0", "--force-recrawl").status == 0
        seen.append(intervals(db, a)["/drifting"])
    assert seen == [7 * DAY, 10.5 * DAY, 15.75 * DAY, 23.625 * DAY, 11.8125 * DAY,
                    17.71875 * DAY]


def test_force_recrawl_and_time_offset_in_process(
    serve, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = serve({"a": recrawl_site()})
    a = site.origins["a"]
    assert courtly("crawl", a + "/", "--db", db, "--min-delay", "0").status == 0
    run = courtly("crawl", "--db", db, "--min-delay", "0", "--force-recrawl")
    assert run.status == 0
    paths = fetched_paths(site, "a")
    assert len(paths) == 10 and sorted(paths[5:]) == sorted(paths[:5])
    assert site.hits_for("a")[-5:][0].path  # requests were made again
    same = [h for h in site.hits_for("a") if h.path == "/same"]
    assert same[1].headers["If-None-Match"] == '"v1"'
    # the clock is read at each call: moving it makes pages due in-process too
    move_clock(monkeypatch, 30 * DAY)
    assert courtly("crawl", "--db", db, "--min-delay", "0").status == 0
    assert len(fetched_paths(site, "a")) == 15


@pytest.mark.parametrize("db", [
    "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_a_sitemap_lastmod_after_the_last_crawl_makes_that_page_due(
    serve, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the entry whose <lastmod> is after its page's last crawl is due (before: none);
    an older one, one in the future and an entry without one change nothing."""
    site = serve({"a": {"/": Page(html("Home", ["/old", "/new", "/future", "/none"]))}
                  | {f"/{p}": Page(html(p, [])) for p in ("old", "new", "future", "none")}})
    a, pages = site.origins["a"], site.sites["a"]
    pages["/robots.txt"] = robots("User-agent: *\nAllow: /\nSitemap: /sitemap.xml\n")
    pages["/sitemap.xml"] = Page(b"not yet", 404)  # an error: due again in a day
    crawl = ("crawl", "--db", db, "--min-delay", "0", "--strategy", "discovery")
    assert courtly(*crawl, a + "/").status == 0
    first = len(fetched_paths(site, "a"))
    after = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + DAY))
    entries = {"old": "2020-01-01", "new": after, "future": "2999-01-01T00:00:00+00:00",
               "none": ""}
    urlset = "".join(f"<url><loc>{a}/{p}</loc>" + (f"<lastmod>{m}</lastmod>" if m else "")
                     + "</url>" for p, m in entries.items())
    pages["/sitemap.xml"] = Page(f"<urlset>{urlset}</urlset>", 200,
                                 {"Content-Type": "application/xml"})
    pages["/new"] = Page(html("new, changed", []))
    move_clock(monkeypatch, 2 * DAY)  # the sitemap is due, the pages (7 days) are not
    run = courtly(*crawl)
    assert run.status == 0, run.err
    assert fetched_paths(site, "a")[first:] == ["/sitemap.xml", "/new"]


# -- the interval rules on their own ----------------------------------------------------


def action(code: ExitCode, content_hash: str | None = None) -> CrawlAction:
    return CrawlAction(
        Candidate(1, "http://a/", 0), "http://a", code, 1000.0, content_hash=content_hash
    )


def cand(last: float | None, code: str | None, content_hash: str | None = "h1") -> Candidate:
    return Candidate(
        1, "http://a/", 0, content_hash=content_hash, recrawl_interval=last, exit_code=code
    )


def test_interval_rules() -> None:
    rules, robots = Recrawl(), Robots(expiry=1800)
    # first crawl: the category's interval
    assert interval(action(ExitCode.OK, "h1"), cand(None, None, None), rules, robots) == 7 * DAY
    # changed content shrinks, unchanged grows, within bounds
    assert interval(action(ExitCode.OK, "h2"), cand(4 * DAY, "OK"), rules, robots) == 2 * DAY
    assert interval(action(ExitCode.OK, "h1"), cand(4 * DAY, "OK"), rules, robots) == 6 * DAY
    assert (
        interval(action(ExitCode.NOT_MODIFIED), cand(80 * DAY, "OK"), rules, robots)
        == rules.max_interval
    )
    assert (
        interval(action(ExitCode.OK, "h2"), cand(3600, "OK"), rules, robots) == rules.min_interval
    )
    # errors come back sooner, backing off while they repeat
    assert interval(action(ExitCode.HTTP_SERVER_ERROR), cand(7 * DAY, "OK"), rules, robots) == DAY
    assert (
        interval(action(ExitCode.TIMEOUT), cand(DAY, "HTTP_SERVER_ERROR"), rules, robots) == 2 * DAY
    )
    assert (
        interval(action(ExitCode.TIMEOUT), cand(80 * DAY, "TIMEOUT"), rules, robots)
        == rules.max_interval
    )
    # blocked by robots.txt: when robots.txt expires
    assert (
        interval(
            action(ExitCode.BLOCKED_BY_ROBOTS_TXT), cand(None, None), rules, Robots(expiry=7200)
        )
        == 7200
    )
    # adaptive off: fixed intervals
    fixed = Recrawl(adaptive=False, ok=5 * DAY)
    assert interval(action(ExitCode.OK, "h2"), cand(4 * DAY, "OK"), fixed, robots) == 5 * DAY
    act = action(ExitCode.OK, "h2")
    assert next_due(act, cand(4 * DAY, "OK"), rules, robots) == 1000.0 + 2 * DAY
    assert act.recrawl_interval == 2 * DAY


def test_recrawl_config_keys(
    serve, db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = serve({"a": recrawl_site()})
    config = tmp_path / "crawl.toml"
    config.write_text("[recrawl]\nok = 3600\nerror = 60\nmin_interval = 60\nadaptive = false\n")
    a = site.origins["a"]
    assert courtly("crawl", a + "/", "--db", db, "--min-delay", "0", "--config", config).status == 0
    assert intervals(db, a)["/"] == 3600 and intervals(db, a)["/gone"] == 60
    move_clock(monkeypatch, 120)  # two minutes later: only the error is due
    assert courtly("crawl", "--db", db, "--min-delay", "0", "--config", config).status == 0
    assert fetched_paths(site, "a")[5:] == ["/gone"]


def misbehaving_site() -> dict[str, object]:
    """Validators as real servers get them wrong; each page's first answer is a 200."""
    future = formatdate(time.time() + 365 * DAY, usegmt=True)

    def unasked(count: int) -> Page:  # 304 to every request, validators or not
        return Page(b"", 304, {"ETag": '"u1"'})

    def dropped(count: int) -> Page:  # an ETag, then a new body without one
        headers = {"Content-Type": HTML} | ({"ETag": '"d1"'} if count == 0 else {})
        return Page(html(f"Dropped {count}", []), headers=headers)

    def renamed(count: int) -> Page:  # a 304 naming a new ETag (RFC 9111 §4.3.4)
        if count == 0:
            return Page(html("Renamed", []), headers={"Content-Type": HTML, "ETag": '"r1"'})
        return Page(b"", 304, {"ETag": f'"r{count + 1}"'})

    def dated(last_modified: str) -> Page:
        return Page(html(last_modified, []),
                    headers={"Content-Type": HTML, "Last-Modified": last_modified})

    return {
        "/": Page(html("Home", ["/unasked", "/dropped", "/renamed", "/future", "/garbage",
                                "/both"])),
        "/unasked": unasked,
        "/dropped": dropped,
        "/renamed": renamed,
        "/future": dated(future),
        "/garbage": dated("yesterday-ish"),
        "/both": Page(html("Both", []), headers={
            "Content-Type": HTML, "ETag": 'W/"b1"', "Last-Modified": LAST_MODIFIED}),
    }


@pytest.mark.parametrize(
    "db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_validators_kept_are_the_kept_bodys_and_a_304_answers_only_a_conditional_request(
    serve, db: Path
) -> None:
    site = serve({"a": misbehaving_site()})
    a = site.origins["a"]
    assert courtly("crawl", a + "/", "--db", db, "--min-delay", "0").status == 0
    for _ in range(2):
        assert courtly("crawl", "--db", db, "--min-delay", "0", "--force-recrawl").status == 0
    sent: dict[str, list[tuple[str | None, str | None]]] = {}
    for hit in site.hits_for("a"):
        sent.setdefault(hit.path, []).append(
            (hit.headers.get("If-None-Match"), hit.headers.get("If-Modified-Since")))
    cands = candidates(db)
    # a 304 to a request that carried no validators confirms nothing: not NOT_MODIFIED
    assert sent["/unasked"] == [(None, None)] * 3
    unasked = cands[a + "/unasked"]
    assert (unasked["exit_code"], unasked["etag"]) == ("PROTOCOL_ERROR", None)
    assert unasked["detail"] == "304 Not Modified to a request without validators"
    # a new body without an ETag: the old body's ETag is not sent again
    assert sent["/dropped"] == [(None, None), ('"d1"', None), (None, None)]
    # a 304's new ETag replaces the stored one, and is the one sent next
    assert sent["/renamed"] == [(None, None), ('"r1"', None), ('"r2"', None)]
    assert cands[a + "/renamed"]["etag"] == '"r3"'
    # a Last-Modified in the future, or no HTTP-date, is not sent back as If-Modified-Since
    assert sent["/future"] == sent["/garbage"] == [(None, None)] * 3
    assert cands[a + "/future"]["last_modified"] is None
    # both validators, a weak ETag as it came
    assert sent["/both"][1:] == [('W/"b1"', LAST_MODIFIED)] * 2
