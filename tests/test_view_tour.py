"""The live view taken as an operator takes it: a page left open through a crawl's end, a server
that stalls, a client that never reads, a second run on the same port."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path
from typing import Any

from courtly.model import ERRORS
from courtly.site import LocalSite, Page, html
from tests.conftest import courtly, courtly_process, rows
from tests.viewing import Served, chromium, screenshot, serving


def small_site(serve: Any, pages: int = 20) -> LocalSite:
    """One origin of `pages` pages: a crawl of a few seconds at --min-delay 0.2."""
    links = [f"/p{k}" for k in range(pages)]
    site: LocalSite = serve({"a": {"/": Page(html("a", links)),
                        **{path: Page(html(path, [], body=f"page {path}")) for path in links}}})
    return site


def test_a_client_that_never_reads_does_not_hold_the_crawl_at_its_end(
        serve: Any, tmp_path: Path) -> None:
    """A client that sent requests and read none of the answers kept a finished crawl from
    exiting for two minutes (the server waited 60 s for each stuck answer), and its summary line
    then said 0.2/s for a crawl of 4/s."""
    site = small_site(serve)
    crawl = Served(courtly_process("crawl", site.url("a"), "--db", str(tmp_path / "crawl.db"),
                                   "--min-delay", "0.2", "--progress", "off", "--serve", "0"))
    port = int(crawl.wait_url().rstrip("/").rpartition(":")[2])
    with socket.create_connection(("127.0.0.1", port)) as stuck:
        stuck.setblocking(False)
        try:  # requests pipelined until the server stops reading them
            while True:
                stuck.send(b"GET /static/view.js HTTP/1.1\r\nHost: courtly\r\n\r\n" * 100)
        except BlockingIOError:
            pass
        began = time.monotonic()
        crawl.proc.wait(90)
        took = time.monotonic() - began
    assert crawl.proc.returncode == 0
    assert took < 20, f"the crawl exited {took:.0f} s after the client stopped reading"
    assert "finished: no origin has work left" in crawl.stop()


def three_origins(serve: Any) -> LocalSite:
    """Two origins of 15 pages and one whose pages all fail: it is given up after its patience,
    its other URLs logged ORIGIN_GIVEN_UP."""
    sites = {name: {"/": Page(html(name, [f"/p{k}" for k in range(15)])),
                    **{f"/p{k}": Page(html(f"{name} {k}", [], body=f"{name} page {k}"))
                       for k in range(15)}} for name in ("alpha", "beta")}
    sites["gamma"] = {"/": Page(html("gamma", [f"/down{k}" for k in range(20)])),
                      **{f"/down{k}": Page("down", status=500) for k in range(20)}}
    site: LocalSite = serve(sites)
    return site


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def shown(page: Any, id: str) -> int:
    return int(page.text_content(f"#{id}").replace(",", ""))


def test_pages_left_open_show_the_end_of_a_crawl_its_true_counts_and_the_next_run(
        serve: Any, tmp_path: Path) -> None:
    """Before, the server went the moment the crawl ended: two pages watching it kept the
    counts of their last refresh (fewer than the database's), said "cannot reach the crawl:
    Failed to fetch" as for a crash, and asked five times every 2 s for ever; the crawl
    actions card also left out the given-up origin's URLs that the crawl log and the exit
    codes count."""
    site = three_origins(serve)
    db, port, config = tmp_path / "crawl.db", free_port(), tmp_path / "crawl.toml"
    config.write_text("[politeness]\npatience = 2\n")
    args = ["crawl", *(site.url(n) for n in site.origins), "--db", db, "--min-delay", "0.2",
            "--progress", "off", "--serve", port, "--config", config]
    with chromium() as browser:
        tabs = [browser.new_page() for _ in range(2)]
        asks: list[tuple[float, str]] = []
        for tab in tabs:
            tab.on("request", lambda r: asks.append((time.monotonic(), r.url)))
        crawl = Served(courtly_process(*map(str, args)))
        for tab in tabs:
            tab.goto(crawl.wait_url())
        assert crawl.proc.wait(90) == 0
        ended = time.monotonic()
        codes = ",".join("?" * len(ERRORS))
        logged = rows(db, f"SELECT count(*) AS n, sum(exit_code IN ({codes})) AS errors "
                          "FROM crawl_log", *map(str, ERRORS))[0]
        assert rows(db, "SELECT count(*) AS n FROM crawl_log "
                        "WHERE exit_code = 'ORIGIN_GIVEN_UP'")[0]["n"] > 0
        for tab in tabs:
            tab.wait_for_function("() => document.getElementById('notice').textContent"
                                  ".includes('server is gone')", timeout=30_000)
            notice = tab.text_content("#notice")
            assert notice.startswith(
                "the crawl has ended (finished: no origin has work left) and its server is gone")
            assert tab.title() == "courtly: crawl ended"
            assert (shown(tab, "total-actions"), shown(tab, "total-errors")) == (
                logged["n"], logged["errors"])
        screenshot(tabs[0], "view-tour-ended.png")
        time.sleep(12)
        late = [url for at, url in asks if at > ended + 6 and "/api/" in url]
        assert len(late) <= 2 * 2 * 5, late  # two tabs, at most two asks of five in 10 s
        # the next run on the same address: the pages follow it
        crawl = Served(courtly_process(*map(str, args), "--force-recrawl", "--min-delay", "2"))
        crawl.wait_url()
        for tab in tabs:
            tab.wait_for_function("() => document.getElementById('notice').hidden && "
                                  "document.title === 'courtly: live crawl'", timeout=30_000)
        crawl.stop()


def test_a_stalled_server_is_asked_once_at_a_time_and_said_so(
        serve: Any, tmp_path: Path) -> None:
    """Before, the page asked its five questions every 2 s whether or not the server had
    answered the last ones (a stalled server got 25 more in 10 s, and all of them at once when
    it woke), and said nothing while it waited. Without JavaScript the page says where the same
    numbers are."""
    site = small_site(serve, pages=3)
    db = tmp_path / "crawl.db"
    assert courtly("crawl", site.url("a"), "--db", db, "--progress", "off").status == 0
    with chromium() as browser, serving("serve", "--db", db, "--port", "0") as view:
        page = browser.new_page()
        asks: list[float] = []
        page.on("request", lambda r: asks.append(time.monotonic()) if "/api/" in r.url else None)
        page.goto(view.url)
        page.wait_for_function("() => Number(document.body.dataset.renders) >= 2")
        view.proc.send_signal(signal.SIGSTOP)
        stalled = time.monotonic()
        try:
            page.wait_for_function("() => document.getElementById('notice').textContent"
                                   ".includes('does not answer within 10 s')", timeout=30_000)
            assert len([at for at in asks if at > stalled]) <= 5
        finally:
            view.proc.send_signal(signal.SIGCONT)
        page.wait_for_function("() => document.getElementById('notice').hidden",
                               timeout=30_000)
        assert shown(page, "total-actions") == 4
        plain = browser.new_context(java_script_enabled=False).new_page()
        plain.goto(view.url)
        assert "JavaScript, which is off" in plain.inner_text("body")
        assert plain.get_attribute("a[href='metrics']", "href") == "metrics"
