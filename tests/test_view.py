"""The live view as a person sees it: `courtly crawl --serve` and `courtly serve` against real
local sites, /metrics parsed by prometheus_client, the page rendered in headless Chromium."""

from __future__ import annotations

import hashlib
import json
import socket
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from courtly.site import LocalSite, Page, html
from tests.conftest import courtly
from tests.viewing import chromium, screenshot, serving, until

PAGES = 150
#: text a hostile server controls, which the page must show literally and never run
SCRIPT = "<script>window.__pwned = 1</script>"
IMG = '"><img src=x onerror="window.__pwned = 2">'


def long_site(serve: Any, names: tuple[str, ...] = ("alpha", "beta")) -> LocalSite:
    """Origins of PAGES pages (a crawl of over ten seconds), each with a page that fails and one
    whose Content-Encoding header (which the error detail quotes) is hostile."""
    sites: dict[str, dict[str, Page]] = {}
    for name in names:
        pages = {"/": Page(html(name, ["/broken", "/hostile", *(f"/p{k}" for k in range(PAGES))]))}
        for k in range(PAGES):
            pages[f"/p{k}"] = Page(html(f"{name} {k}", [], body=f"{name} page {k}"), delay=0.01)
        pages["/broken"] = Page("down", status=500)
        pages["/hostile"] = Page("x", headers={"Content-Type": "text/html",
                                               "Content-Encoding": SCRIPT + IMG})
        sites[name] = pages
    return serve(sites)


def crawl_args(site: LocalSite, db: Path) -> list[str]:
    """A crawl of about 30 s an origin: long enough to outlast a slow start of Chromium on a busy
    machine (the tests stop it when done)."""
    return ["crawl", *(site.url(n) for n in site.origins), "--db", db, "--min-delay", "0.2",
            "--progress", "off"]


def samples(families: dict[str, Any], name: str) -> list[Any]:
    return list(families[name].samples)


def value(families: dict[str, Any], name: str, sample: str, **labels: str) -> float:
    for s in samples(families, name):
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise AssertionError(f"no sample {sample} {labels} in {name}")


def test_metrics_of_a_live_crawl_grow_between_two_scrapes(serve: Any, tmp_path: Path) -> None:
    site = long_site(serve)
    with serving(*crawl_args(site, tmp_path / "crawl.db"), "--serve", "0") as crawl:
        assert crawl.url.startswith("http://127.0.0.1:")  # loopback unless asked otherwise
        first = until(lambda: (m := crawl.metrics()) and "OK" in str(
            m["courtly_crawl_actions"].samples) and m)
        grown = (("courtly_requests", "courtly_requests_total", {}),
                 ("courtly_crawl_actions", "courtly_crawl_actions_total", {"exit_code": "OK"}),
                 ("courtly_response_bytes", "courtly_response_bytes_total", {}),
                 ("courtly_response_seconds", "courtly_response_seconds_count", {}))

        def all_grown() -> dict[str, Any] | None:
            now = crawl.metrics()
            return now if all(value(now, name, sample, **labels) > value(
                first, name, sample, **labels) for name, sample, labels in grown) else None

        second = until(all_grown, message="the counters did not grow")
    assert second["courtly_requests"].type == "counter"
    assert second["courtly_response_seconds"].type == "histogram"
    buckets = [s.value for s in samples(second, "courtly_response_seconds")
               if s.name.endswith("_bucket")]
    assert buckets == sorted(buckets) and buckets[-1] == value(
        second, "courtly_response_seconds", "courtly_response_seconds_count")
    origins = [s.value for s in samples(second, "courtly_origins")]
    assert sum(origins) == len(site.origins)
    assert samples(second, "courtly_requests_in_flight")
    # label values stay bounded: no URL or origin is ever a label
    labels = {k for family in second.values() for s in family.samples for k in s.labels}
    assert labels <= {"exit_code", "state", "le"}


def test_the_page_of_a_live_crawl_in_chromium(serve: Any, tmp_path: Path) -> None:
    site = long_site(serve)
    alpha = site.url("alpha", "")
    with chromium() as browser, \
            serving(*crawl_args(site, tmp_path / "crawl.db"), "--serve", "0") as crawl:
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        scripts_errors: list[str] = []
        page.on("pageerror", lambda exc: scripts_errors.append(str(exc)))
        page.goto(crawl.url)
        page.wait_for_function(
            "origin => [...document.querySelectorAll('#origins td.origin')]"
            ".some(td => td.textContent === origin)", arg=alpha)
        before = page.text_content("#total-actions")
        renders = int(page.get_attribute("body", "data-renders") or 0)
        page.wait_for_function(
            "([old, n]) => Number(document.body.dataset.renders) > n && "
            "document.getElementById('total-actions').textContent !== old", arg=[before, renders])
        after = page.text_content("#total-actions")
        assert int(after.replace(",", "")) > int(before.replace(",", ""))
        # the rate chart is drawn: a line of several points
        points = page.get_attribute("#rate-chart svg polyline.series", "points") or ""
        assert len(points.split()) >= 2
        assert page.locator("#exit-codes svg rect.bar").count() >= 1
        # the errors a server caused are listed, its text shown as text
        page.wait_for_function(
            "t => [...document.querySelectorAll('#errors td.detail')]"
            ".some(td => td.textContent.includes(t))", arg=SCRIPT + IMG)
        # the origins table sorts by a column on a click
        page.click("#origins th[data-key='origin']")
        page.wait_for_function("() => document.querySelector(\"#origins th[data-key='origin']\")"
                               ".dataset.order === 'asc'")
        shown = [td.text_content() for td in page.query_selector_all("#origins td.origin")]
        assert shown == sorted(shown) and len(shown) == 2
        screenshot(page, "view-live-crawl.png")
        assert page.evaluate("typeof window.__pwned") == "undefined"
        assert page.locator("img").count() == 0
        assert not scripts_errors


def hostile_database(path: Path, site: LocalSite) -> None:
    """A crawled database whose origin, URL and error detail hold markup (as a hostile site's
    answers could, or a hand-edited file)."""
    with sqlite3.connect(path) as con:
        origin = f"http://{SCRIPT}{IMG}.example"
        con.execute("INSERT INTO origins (origin, configured, robots_error) VALUES (?, 1, ?)",
                    (origin, SCRIPT + IMG))
        con.execute(
            "INSERT INTO crawl_log (run, url, origin, started, elapsed, exit_code, http_status, "
            "detail) VALUES (1, ?, ?, strftime('%s', 'now'), 0.5, 'HTTP_SERVER_ERROR', 500, ?)",
            (f"{origin}/{SCRIPT}?q={IMG}", origin, f"server said {SCRIPT}{IMG}"))


def test_text_from_the_web_is_shown_as_text_and_never_runs(serve: Any, tmp_path: Path) -> None:
    site = serve({"s": {"/": Page(html("home", ["/a"])), "/a": Page("down", status=503)}})
    db = tmp_path / "crawl.db"
    assert courtly("crawl", site.url("s"), "--db", db, "--min-delay", "0",
                   "--max-actions", "2", "--progress", "off").status == 0
    hostile_database(db, site)
    with serving("serve", "--db", db, "--port", "0") as view, chromium() as browser:
        page = browser.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(view.url)
        page.wait_for_function("() => Number(document.body.dataset.renders) >= 2")
        origins = [td.text_content() for td in page.query_selector_all("#origins td.origin")]
        assert f"http://{SCRIPT}{IMG}.example" in origins
        robots = page.locator("#origins td").all_text_contents()
        assert f"unavailable: {SCRIPT}{IMG}" in robots
        details = [td.text_content() for td in page.query_selector_all("#errors td.detail")]
        urls = [td.text_content() for td in page.query_selector_all("#errors td.url")]
        assert f"server said {SCRIPT}{IMG}" in details
        assert any(SCRIPT in u and IMG in u for u in urls)
        assert page.evaluate("typeof window.__pwned") == "undefined"
        assert page.locator("img").count() == 0
        assert page.locator("script").count() == 2  # courtly's own two files
        assert not dialogs
        screenshot(page, "view-hostile-text.png")


def tags(text: str) -> list[tuple[str, dict[str, str | None]]]:
    """The start tags of an HTML document and their attributes."""
    found: list[tuple[str, dict[str, str | None]]] = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            found.append((tag, dict(attrs)))

    Tags().feed(text)
    return found


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_serve_follows_a_crawl_in_its_database_and_changes_nothing(
    serve: Any, tmp_path: Path
) -> None:
    site = long_site(serve, ("alpha",))
    db = tmp_path / "crawl.db"
    with serving(*crawl_args(site, db), "--serve", "0") as crawl, \
            serving("serve", "--db", db, "--port", "0") as view:
        first = until(lambda: (s := view.json("api/summary"))["actions"] > 0 and s)
        until(lambda: view.json("api/summary")["actions"] > first["actions"],
              message="the view does not follow the crawl log")
        origins = view.json("api/origins?sort=actions&order=desc")
        assert origins["origins"][0]["origin"] == site.url("alpha", "")
        assert origins["origins"][0]["robots"] == "404: allow all"
        series = view.json("api/series")
        assert sum(series["actions"]) > 0 and series["step"] > 0
        crawl.stop()
        for path in ("", "api/summary", "api/origins", "metrics", "static/view.js"):
            for method in ("POST", "PUT", "DELETE", "PATCH"):
                request = urllib.request.Request(view.url + path, method=method, data=b"x")
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(request, timeout=10)
                assert refused.value.code == 405, (method, path)
        before = sha256(db)
        assert view.json("api/summary")["actions"] >= first["actions"]
        assert view.metrics()["courtly_crawl_actions"].samples
        assert sha256(db) == before


def test_serve_mistakes_are_one_line(tmp_path: Path, serve: Any) -> None:
    run = courtly("serve", "--db", tmp_path / "missing.db")
    assert run.status == 2
    assert run.err.strip() == f"courtly: no crawl database at {tmp_path}/missing.db"
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    run = courtly("serve", "--db", other)
    assert run.status == 2 and "is not a courtly crawl database" in run.err
    assert not (tmp_path / "missing.db").exists()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        site = serve({"s": {"/": Page(html("home", []))}})
        db = tmp_path / "crawl.db"
        run = courtly("crawl", site.url("s"), "--db", db, "--serve", port, "--progress", "off")
        assert run.status == 2, run.err
        assert run.err.strip().splitlines() == [
            f"courtly: cannot serve on 127.0.0.1:{port}: Address already in use"]
        assert site.hits == []  # nothing was crawled
        run = courtly("serve", "--db", db, "--port", port)
        assert run.status == 2 and "Address already in use" in run.err
    for wrong in ("nope", "70000", "host:", ":80", "\u00b2", "host:\u0661\u0662"):
        run = courtly("crawl", site.url("s"), "--db", db, "--serve", wrong)
        assert run.err.strip().splitlines() == [
            f"courtly: serve: {wrong!r} is not [HOST:]PORT with a port from 0 to 65535"], run.err
        assert run.status == 2 and site.hits == []


def test_serve_with_an_empty_host_does_not_listen_on_every_address(
        tmp_path: Path, serve: Any) -> None:
    """`courtly serve --host ""` (a script's unset variable) served the page, which has no
    login, on 0.0.0.0; `--serve :8080` is refused, and so is this now. `--host [::1]` is read
    as `--serve [::1]:PORT` reads it."""
    site = serve({"s": {"/": Page(html("home", []))}})
    db = tmp_path / "crawl.db"
    assert courtly("crawl", site.url("s"), "--db", db, "--progress", "off").status == 0
    for host in ("", " "):
        proc = subprocess.run([sys.executable, "-m", "courtly", "serve", "--db", str(db),
                               "--host", host, "--port", "0"],
                              capture_output=True, text=True, timeout=20)
        assert proc.returncode == 2 and proc.stderr.splitlines() == [
            "courtly: --host: give an address to listen on (0.0.0.0 for every one)"]
    with serving("serve", "--db", db, "--host", "[::1]", "--port", "0") as view:
        assert view.url.startswith("http://[::1]:")
        assert view.json("api/summary")["actions"] == 1


def test_serve_refuses_a_file_that_is_not_sqlite_as_report_does(tmp_path: Path) -> None:
    """`courtly serve --db notes.txt` once said "serving notes.txt" and ran, answering every
    request but the page with 503 "file is not a database" (connecting reads nothing)."""
    notes = tmp_path / "notes.db"
    notes.write_text("not a database, but the user's notes\n" * 200)
    before = notes.read_bytes()
    for command in (["serve", "--port", "0"], ["report", "--out", str(tmp_path / "r.html")]):
        proc = subprocess.run([sys.executable, "-m", "courtly", *command, "--db", str(notes)],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.splitlines() == [f"courtly: cannot read {notes}: file is not a database"]
    assert notes.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_serve_and_report_refuse_a_newer_database_and_a_directory_as_stats_does(
        tmp_path: Path) -> None:
    """Before: they read a database of a newer schema (whose tables may mean other things),
    and said "disk I/O error" of a directory."""
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as con:
        con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        con.execute("INSERT INTO schema_version VALUES (999)")
    con.close()
    expected = {newer: f"courtly: {newer} was written by a newer courtly (schema 999)",
                tmp_path: f"courtly: database path is a directory: {tmp_path}"}
    for db, line in expected.items():
        for command in (["serve", "--port", "0"], ["report", "--out", str(tmp_path / "r.html")],
                        ["stats"]):
            proc = subprocess.run([sys.executable, "-m", "courtly", *command, "--db", str(db)],
                                  capture_output=True, text=True, timeout=30)
            assert proc.returncode == 1, proc.stderr
            assert proc.stderr.splitlines() == [line], (command, proc.stderr)
    assert not (tmp_path / "r.html").exists()


def test_the_report_is_one_file_that_renders_in_chromium(serve: Any, tmp_path: Path) -> None:
    slow = {"/": Page(html("slow", ["/a", "/b"])), "/a": Page("a", delay=0.3),
            "/b": Page("b", delay=0.3)}
    failing = {"/": Page(html("failing", ["/x", "/y", "/hostile"])),
               "/x": Page("down", status=500), "/y": Page("down", status=502),
               "/hostile": Page("x", headers={"Content-Type": "text/html",
                                              "Content-Encoding": SCRIPT + IMG})}
    site = serve({"slow": slow, "failing": failing})
    db = tmp_path / "crawl.db"
    assert courtly("crawl", site.url("slow"), site.url("failing"), "--db", db, "--min-delay",
                   "0", "--progress", "off").status == 0
    out = tmp_path / "report.html"
    run = courtly("report", "--db", db, "--out", out)
    assert run.status == 0, run.err
    text = out.read_text()
    # self-contained: no element refers to another file
    assert [tag for tag in tags(text) if {"src", "href"} & set(tag[1])] == []
    assert [tag[0] for tag in tags(text)].count("script") == 2
    assert "<script>window.__pwned" not in text  # the data cannot close its element
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.route("**/*", lambda route: route.abort()
                   if not route.request.url.startswith("file:") else route.continue_())
        page.goto(out.as_uri())
        page.wait_for_selector("body[data-drawn='1']")
        assert len((page.get_attribute("#rate-chart polyline.series", "points") or "").split()) >= 2
        codes = page.locator("#exit-codes .bar-label").all_text_contents()
        assert {"OK", "HTTP_SERVER_ERROR", "PROTOCOL_ERROR"} <= set(codes)
        assert page.locator("#elapsed rect.bar").count() == 14
        assert page.locator("#slowest .bar-label").first.text_content() == site.url("slow", "")
        assert page.locator("#failing .bar-label").first.text_content() == site.url("failing", "")
        details = page.locator("#latest-errors td.detail").all_text_contents()
        assert any(SCRIPT + IMG in d for d in details)
        assert page.evaluate("typeof window.__pwned") == "undefined"
        assert page.locator("img").count() == 0
        assert not errors, errors
        screenshot(page, "report.png")
    assert courtly("report", "--db", db, "--out", db).status == 2
    missing = courtly("report", "--db", tmp_path / "none.db", "--out", out)
    assert missing.status == 2 and missing.err.startswith("courtly: no crawl database")


def test_a_database_that_fails_under_the_view_is_one_line_not_a_crash(
    serve: Any, tmp_path: Path
) -> None:
    site = serve({"s": {"/": Page(html("home", []))}})
    db = tmp_path / "crawl.db"
    assert courtly("crawl", site.url("s"), "--db", db, "--progress", "off").status == 0
    with serving("serve", "--db", db, "--port", "0") as view:
        assert view.json("api/origins")["total"] == 1
        with sqlite3.connect(db) as con:  # another program breaks the database
            con.execute("ALTER TABLE origins RENAME TO gone")

        def refused() -> Any:
            try:
                view.get("api/origins")
            except urllib.error.HTTPError as exc:
                return exc
            return None

        answer = until(refused, message="the view did not notice")
        assert answer.code == 503
        assert "no such table: origins" in json.loads(answer.read())["error"]
        assert view.json("api/errors") == {"errors": []}  # the rest still answers
    assert "Traceback" not in view.stop()
