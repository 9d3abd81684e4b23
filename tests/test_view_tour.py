"""The live view taken as an operator takes it: a page left open through a crawl's end, a server
that stalls, a client that never reads, a second run on the same port."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from courtly.site import LocalSite, Page, html
from tests.conftest import courtly_process
from tests.viewing import Served


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
