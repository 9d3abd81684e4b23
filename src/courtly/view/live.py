"""The view of a running crawl (`crawl --serve`, `worker --serve`): its counters in memory.

Nothing here runs on the crawl's hot path: the crawl bumps CrawlStats' numbers; this reads them
when a page or a scrape asks (and samples the totals twice a second for the rate chart). The
only database query is the fleet's workers table (bounded), on a thread and connection of its
own.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from courtly import clock
from courtly.model import ERRORS
from courtly.scheduler import delay_for
from courtly.view.cached import Cached
from courtly.view.origins import OriginTable, OriginView, robots_status
from courtly.view.series import Series

if TYPE_CHECKING:
    from courtly.config import CrawlConfig
    from courtly.scheduler import OriginCrawler
    from courtly.stats import CrawlStats
    from courtly.store import Store
    from courtly.store.reader import Reader

#: the origins table is built again at most this often, and never more often than FACTOR times
#: the time building it took (its cost grows with the origins: 30,000 origins cost the crawl
#: loop a fraction of a second, at most 1/FACTOR of its time)
ORIGINS_EVERY = 1.0
FACTOR = 50.0
#: the rate chart: counts are sampled this often into bins of STEP seconds (a sample lands in
#: the bin of its time, so a late sample shifts at most SAMPLE seconds of counts)
SAMPLE = 0.5
STEP = 2.0
#: when the crawl ends, a page that asked for the summary in the last WATCHED seconds is answered
#: LINGER seconds more, so that it shows the end (it asks every 2 s) before the server goes
WATCHED = 10.0
LINGER = 3.0


class LiveCrawl(Protocol):
    """What the view reads of a crawl (courtly.crawler.Crawler)."""

    stats: CrawlStats
    crawlers: dict[str, OriginCrawler]
    config: CrawlConfig
    store: Store


class LiveView:
    """A running crawl's counters, its origin crawlers' states, and its fleet."""

    source = "live"

    def __init__(self, crawl: LiveCrawl, reader: Reader | None) -> None:
        self.crawl = crawl
        self.reader = reader
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="courtly-view")
        self._fleet = Cached(reader.fleet, self.executor) if reader is not None else None
        stats = crawl.stats
        self.started = clock.now() - (time.monotonic() - stats.started)
        self.bins = Series(self.started, STEP)
        self._sampled = (stats.actions, stats.requests)
        self._table = OriginTable([])
        self._table_at = -float("inf")
        self._table_took = 0.0
        self._asked = -float("inf")

    async def run(self) -> None:
        """Add the crawl actions and requests since the last sample to the rate chart."""
        while True:
            await asyncio.sleep(SAMPLE)
            actions, requests = self._actions(), self.crawl.stats.requests
            self.bins.add(clock.now(), actions - self._sampled[0], requests - self._sampled[1])
            self._sampled = (actions, requests)

    async def linger(self) -> None:
        """Answer a page that was watching a while more, so that it sees the crawl's end; a
        signal (Ctrl-C) ends the wait."""
        if time.monotonic() - self._asked > WATCHED:
            return
        loop, done = asyncio.get_running_loop(), asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, done.set)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), LINGER)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    def _actions(self) -> int:
        """Crawl actions recorded, the given-up origins' URLs (no --max-actions budget) too, as
        the crawl log has them."""
        return sum(self.crawl.stats.exit_codes.values())

    def close(self) -> None:
        """Stop the database thread and close its connection."""
        if self.reader is not None:
            self.executor.submit(self.reader.close)
        self.executor.shutdown(wait=True)

    @property
    def worker(self) -> str | None:
        """This worker's id in a fleet."""
        worker = getattr(self.crawl.store, "worker", None)
        return worker if isinstance(worker, str) else None

    async def summary(self) -> dict[str, Any]:
        """Totals and rates of this crawl process."""
        stats, now = self.crawl.stats, clock.now()
        self._asked = time.monotonic()
        rates = self.bins.rate(now)
        origins = await self.origins()
        by_state = {state: n for state, n in origins.states.items() if n}
        return {
            "source": self.source, "db": self._db(), "worker": self.worker, "now": now,
            "started": self.started, "latest": now, "actions": self._actions(),
            "requests": stats.requests, "errors": sum(stats.origin_errors.values()),
            "bytes": stats.response_bytes, "in_flight": stats.in_flight,
            "rate": {"actions": rates[0], "requests": rates[1]},
            "exit_codes": dict(stats.exit_codes.most_common()),
            "origins": {"total": max(len(origins.rows), stats.origins_total), **by_state},
            "candidates": None, "run": None, "stop_reason": stats.stop_reason,
            "error_codes": sorted(ERRORS), "reading": False, "failure": "",
        }

    def _db(self) -> str:
        from courtly.store.postgres import shown_url

        db = self.crawl.config.db
        return shown_url(db) if "://" in db else db

    def series(self) -> dict[str, Any]:
        """Crawl actions and HTTP requests (robots.txt included) per bin."""
        return self.bins.data()

    async def origins(self) -> OriginTable:
        """The origin crawlers of this process, each in its state (see FACTOR)."""
        began = time.monotonic()
        if began - self._table_at >= max(ORIGINS_EVERY, FACTOR * self._table_took):
            self._table = OriginTable(self._build_rows())
            self._table_at = time.monotonic()
            self._table_took = self._table_at - began
        return self._table

    def _build_rows(self) -> list[OriginView]:
        stats, rules = self.crawl.stats, self.crawl.config.politeness
        now, wall = time.monotonic(), clock.now()
        rows = []
        for origin, crawler in list(self.crawl.crawlers.items()):
            state, reason = _state(crawler, now, wall)
            rows.append(OriginView(
                origin, state, reason, stats.origin_actions.get(origin, 0),
                stats.origin_errors.get(origin, 0), round(delay_for(crawler, rules), 3),
                robots_status(crawler.state.robots_status, crawler.state.robots_error),
            ))
        return rows

    def errors(self) -> list[dict[str, Any]]:
        """The latest errors, newest first."""
        latest = reversed(self.crawl.stats.latest_errors)
        return [{"time": t, "url": url, "origin": origin, "exit_code": code,
                 "http_status": status, "detail": detail}
                for t, url, origin, code, status, detail in latest]

    async def workers(self) -> dict[str, Any]:
        """The fleet's workers (from the database), when this crawl is one of them."""
        if self._fleet is None or self.worker is None:
            return {"fleet": False, "partitions": 0, "free_partitions": 0, "workers": []}
        return await self._fleet.get()


def _state(crawler: OriginCrawler, now: float, wall: float) -> tuple[str, str]:
    """An origin crawler's state in words, and why."""
    if crawler.finished:
        ending = crawler.ending if crawler.gave_up else None
        return "finished", ending.text if ending else "no work left"
    if crawler.in_turn:
        return "crawling", ""
    if crawler.next_request_at > now:
        if crawler.state.backoff_until > wall or (crawler.robots is None
                                                   and crawler.state.robots_error):
            return "backing off", f"level {crawler.state.backoff_level}, " \
                f"{crawler.next_request_at - now:.1f}s left"
        return "waiting", f"{crawler.next_request_at - now:.1f}s left"
    return "ready", "waiting for a free slot (--concurrency)"
