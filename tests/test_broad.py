"""A broad crawl holds little per origin: an origin waiting for its delay keeps a compact record
(docs/scaling.md)."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from courtly import crawler as crawler_module
from courtly import scheduler
from courtly.cli import inject_seeds
from courtly.config import Limits, load_config
from courtly.crawler import Crawler
from courtly.fetch import Fetcher
from courtly.model import OriginState
from courtly.site import Page, html
from courtly.stats import CrawlStats
from courtly.store import open_store
from courtly.strategy import load_strategy
from tests.conftest import robots

ORIGINS = 12


def test_an_origin_waiting_for_its_delay_holds_no_todo_list_and_shares_its_robots_rules(
    serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rest_after = 0.2  # what REST_AFTER (5 s) is to a broad crawl's delay of seconds
    monkeypatch.setattr(scheduler, "REST_AFTER", rest_after, raising=False)
    monkeypatch.setattr(crawler_module, "REST_AFTER", rest_after, raising=False)
    site = serve({f"o{i}": {"/robots.txt": robots("User-agent: *\nDisallow: /private\n"),
                            "/": Page(html(f"home {i}", [f"/p{k}" for k in range(10)]))}
                  for i in range(ORIGINS)})
    # each origin: robots.txt, its home page, then one of the ten pages it links; the crawl
    # stops there, every origin waiting for its next turn with nine pages still to crawl
    config = load_config(None, {"db": str(tmp_path / "crawl.db"), "min_delay": rest_after * 2,
                                "max_actions": 2 * ORIGINS, "progress": "off",
                                "dedup": {"near": False}})
    store = open_store(config.db)
    try:
        inject_seeds(store, config, [site.url(f"o{i}") for i in range(ORIGINS)])
        crawl = Crawler(config, store, load_strategy(config.strategy))
        stats = asyncio.run(crawl.run())
    finally:
        store.close()
    assert stats.actions == 2 * ORIGINS
    waiting = list(crawl.crawlers.values())
    assert len(waiting) == ORIGINS and not any(c.finished for c in waiting)
    assert all(c.todo == [] for c in waiting)  # the nine pages are in the database only
    assert len({id(c.robots) for c in waiting}) == 1  # one parse of the one file they serve
    assert len({id(c.state.robots_body) for c in waiting}) == 1


def test_a_connection_the_next_request_cannot_reuse_is_closed_at_once(serve) -> None:
    """An origin whose delay outlives limits.keep_alive leaves no idle connection behind (a
    broad crawl would otherwise hold one for every origin answered in the last seconds)."""
    site = serve({"a": {"/": Page(html("home", []))}})

    async def idle_after(keep_alive: bool) -> int:
        async with Fetcher(Limits(), "courtly-test", {"127.0.0.1"}) as fetcher:
            response = await fetcher.get(site.url("a"), keep_alive=keep_alive)
            assert response.status == 200
            return fetcher.pool.idle_count()

    assert asyncio.run(idle_after(True)) == 1
    assert asyncio.run(idle_after(False)) == 0


def test_the_origins_records_are_frozen_while_the_turns_run() -> None:
    """The collector never scans the records made before the first turn (a broad crawl's every
    origin) and waits for YOUNG_OBJECTS new ones before a young collection; both are undone
    once the turns end."""
    seen: list[tuple[int, int]] = []

    async def turn(crawler: scheduler.OriginCrawler) -> float | None:
        seen.append((gc.get_freeze_count(), gc.get_threshold()[0]))
        return None

    async def run() -> None:
        turns = scheduler.Turns(4, turn, lambda crawler, exc: None, CrawlStats())
        for i in range(3):
            turns.add(scheduler.OriginCrawler(f"http://o{i}.test", OriginState(f"http://o{i}.test"),
                                              patience=1), 0.0)
        await turns.run(lambda: False, [])

    before = gc.get_threshold()
    asyncio.run(run())
    assert len(seen) == 3
    assert all(frozen > 0 and young == scheduler.YOUNG_OBJECTS for frozen, young in seen)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
