"""One origin is not a queue of waits (issue 32 item 5, docs/crawl-loop.md): its next request
leaves once the last answer has arrived, while that page is analysed and recorded; one request in
flight still, an error settled before the next request, the budget exact."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from courtly.cli import inject_seeds
from courtly.config import load_config
from courtly.crawler import Crawler
from courtly.site import LocalSite, Page, html
from courtly.stats import CrawlStats, StopKind
from courtly.store import open_store
from courtly.strategy import BreadthFirst, Response
from tests.conftest import robots

#: a page the page worker takes tens of milliseconds on (1.2 MB, 4,000 links, out of scope: not
#: crawled); the crawl loop sends its next request in a few
HEAVY = html("heavy", [], body="<ul>" + "".join(
    f'<li><a href="http://elsewhere.test/p/{i}?q={i}">link {i}</a> '
    + " ".join(f"w{(i + k) % 997}" for k in range(40)) + "</li>" for i in range(4000)) + "</ul>")


class Timed(BreadthFirst):
    """Breadth-first, noting when each page's analysis reached the strategy."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.analysed: dict[str, float] = {}

    def page_crawled(self, response: Response) -> None:
        self.analysed[response.request.url] = time.monotonic()
        super().page_crawled(response)


class Goal(Timed):
    """Done after one page: asked before the origin's next request."""

    def finished(self) -> bool:
        return bool(self.analysed)


def crawl(tmp_path: Path, site: LocalSite, paths: list[str], strategy: Timed | None = None,
          **settings: Any) -> tuple[CrawlStats, Timed]:
    """Crawl one origin's `paths` (seeds, in that order) in this process."""
    config = load_config(None, {"db": str(tmp_path / "crawl.db"), "min_delay": 0,
                                "progress": "off", **settings})
    store = open_store(config.db)
    strategy = strategy or Timed()
    try:
        inject_seeds(store, config, [site.url("a", path) for path in paths])
        stats = asyncio.run(Crawler(config, store, strategy).run())
    finally:
        store.close()
    return stats, strategy


def test_the_next_request_leaves_while_the_last_page_is_analysed(serve, tmp_path: Path) -> None:
    site = serve({"a": {"/robots.txt": robots(""), "/heavy": Page(HEAVY),
                        "/next": Page(html("next", []))}})
    stats, strategy = crawl(tmp_path, site, ["/heavy", "/next"])
    assert stats.exit_codes["OK"] == 2
    heavy, after = [h for h in site.hits_for("a") if h.path != "/robots.txt"]
    assert (heavy.path, after.path) == ("/heavy", "/next")
    assert after.arrived >= heavy.done  # one request in flight still
    # the next request arrived before the heavy page's analysis was done (it waited for the
    # page's record before: after page_crawled)
    assert after.arrived < strategy.analysed[site.url("a", "/heavy")]


def test_a_failing_answer_is_settled_before_the_next_request(serve, tmp_path: Path) -> None:
    """Patience 2, every page a 500 after a page that takes long to analyse: the second 500
    ends the origin before a third request (the backoff is waited, from the answer)."""
    failing = {f"/e{i}": Page("down", 500) for i in range(4)}
    site = serve({"a": {"/robots.txt": robots(""), "/heavy": Page(HEAVY), **failing}})
    stats, _ = crawl(tmp_path, site, ["/heavy", *failing],
                     politeness={"patience": 2, "backoff_base": 0.05})
    paths = [h.path for h in site.hits_for("a") if h.path != "/robots.txt"]
    assert paths == ["/heavy", "/e0", "/e1"]
    assert stats.exit_codes == {"OK": 1, "HTTP_SERVER_ERROR": 2, "ORIGIN_GIVEN_UP": 2}


def test_the_budget_counts_the_actions_being_recorded(serve, tmp_path: Path) -> None:
    site = serve({"a": {"/robots.txt": robots(""),
                        **{f"/h{i}": Page(HEAVY) for i in range(5)}}})
    stats, strategy = crawl(tmp_path, site, [f"/h{i}" for i in range(5)], max_actions=2,
                            dedup={"exact": False, "near": False})
    paths = [h.path for h in site.hits_for("a") if h.path != "/robots.txt"]
    assert paths == ["/h0", "/h1"] and stats.actions == 2 and len(strategy.analysed) == 2


def test_a_strategy_with_a_goal_is_asked_before_the_next_request(serve, tmp_path: Path) -> None:
    site = serve({"a": {"/robots.txt": robots(""), "/heavy": Page(HEAVY),
                        "/next": Page(html("next", []))}})
    stats, _ = crawl(tmp_path, site, ["/heavy", "/next"], Goal())
    assert [h.path for h in site.hits_for("a")] == ["/robots.txt", "/heavy"]
    assert stats.stop is not None and stats.stop.kind is StopKind.GOAL
