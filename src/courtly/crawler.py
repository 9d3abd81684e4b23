"""The crawl loop: origin crawlers take turns through the penalty box; one URL, top to bottom.

Follow a URL: `_turn` (robots.txt first: robots_cache.py) → `_next_candidate` (todo list,
outcome.refusal) → `_crawl` (fetch; outcome.read) → `_end` (content.py reads the body, links.py
its links: beside the origin's next request) → `_record` (outcome.settle; one store
transaction). See docs/crawl-loop.md, architecture.md.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable

from courtly import clock, outcome
from courtly.config import CrawlConfig
from courtly.content import ContentReader
from courtly.errors import describe
from courtly.fetch import Fetcher, FetchError, HttpResponse, LocalError
from courtly.gate import Gate
from courtly.links import Links
from courtly.model import Candidate, CrawlAction, ExitCode
from courtly.pageworker import SentPage
from courtly.robots_cache import RobotsCache
from courtly.scheduler import (
    Ending,
    EndKind,
    OriginCrawler,
    Turns,
    backoff_jitter,
    delay_for,
    key_of,
    pause,
    todo_batch,
)
from courtly.stats import CrawlStats, Stop, StopKind
from courtly.steering import Fleet, Steering
from courtly.store import Store, StoreError
from courtly.store.database import Database, StrategyStore
from courtly.strategy import CrawlingStrategy, StoreContext
from courtly.urls import origin_of
from courtly.warc import CrawlArchive

log = logging.getLogger("courtly")


class Crawler:
    """Runs one crawl over the configured origins until done, out of budget, or stopped."""

    def __init__(
        self, config: CrawlConfig, store: Store, strategy: CrawlingStrategy,
        on_progress: Callable[[CrawlStats], None] | None = None, fleet: Fleet | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.db = Database(store, config.fleet.batch_window, fleet)
        self.strategy = strategy
        self.stats = CrawlStats()
        self.on_progress = on_progress
        keys = key_of(config.politeness.politeness_key, lambda h, p: self.fetcher.address_of(h, p))
        self.turns = Turns(config.concurrency, self._turn, self._stop_for, self.stats, keys)
        self.crawlers = self.turns.crawlers
        self.steering = Steering(config, store, self.db, self.turns, self.stats, fleet)
        self.gate = Gate(self.crawlers, config.politeness)  # whichever origin asks (gate.py)
        self.fetcher: Fetcher
        self._opened: set[str] = set()  # origins whose strategy.origin_opened was called
        self.robots = RobotsCache(config, self.db, self.stats)
        context = StoreContext(StrategyStore(self.db), self.turns.live_state)
        strategy.bind(context)
        self.links = Links(strategy, self.db, self.steering.policy, config.normalize,
                           self.steering.admit, context)
        self.content = ContentReader(config, self.db, strategy, self.links)
        self._read_beside = not strategy.has_goal()  # else asked before each request, as it was
        self.warc = CrawlArchive.of(config.warc, store, lambda exc: self._stop_for(None, exc))

    async def run(self) -> CrawlStats:
        """Crawl until every origin is finished, the budget is spent, or a signal arrives."""
        loop = asyncio.get_running_loop()
        try:
            self.run_id = await self.steering.begin()
        except BaseException:
            self.db.close()
            raise
        self.db.stop_on_failure(lambda exc: self._stop_for(None, exc))
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop, Stop(StopKind.SIGNAL, f"stopped by {sig.name}"))
        try:  # a signal during the shut-down is handled too: it is already stopping
            return await self._crawl_until_done()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    async def _crawl_until_done(self) -> CrawlStats:
        """Dispatch turns until done or stopped, then drain, commit and close the strategy."""
        # the address guard lets through the seeds' own hosts, not the origins found in scope
        async with Fetcher.for_crawl(self.config, self.steering.seed_hosts) as self.fetcher:
            self.store.commit_interval = self.config.commit_interval
            try:
                await self.turns.run(self.steering.more, [self._housekeeping(),
                                                         *self.steering.jobs()])
            finally:
                await self.turns.drain()
                self.content.close()
        try:
            try:
                await self.db.flush()  # the writes, and the WARC records queued after them
            finally:
                if self.warc is not None:
                    self.warc.close()  # the last file, indexed
            if self.stats.stop is None:
                self.stats.stop = Stop(StopKind.FINISHED, "finished: no origin has work left")
            await self.steering.end(self.run_id, self.stats.stop)
            try:
                self.strategy.close()
            except StoreError:
                raise
            except Exception as exc:  # the strategy's bug: one line (the first), exit status 1
                if not self.stats.stop.failed:
                    text = f"internal error: strategy close(): {describe(exc)}"
                    self.stats.stop = Stop(StopKind.INTERNAL_ERROR, text)
            await self.db.flush()  # what the strategy saved
        finally:
            self.db.close()
        if self.on_progress:
            self.on_progress(self.stats)
        return self.stats

    def stop(self, stop: Stop) -> None:
        """Stop dispatching new turns (in flight: a grace period); a second signal, waiting."""
        if self.stats.stop is None:
            self.stats.stop = stop
        elif stop.kind is StopKind.SIGNAL:  # no more wait for a database server gone away
            self.store.stop_reconnecting()
        self.turns.stop()

    def _stop_for(self, crawler: OriginCrawler | None, exc: Exception) -> None:
        """A turn (of `crawler`) or a helper task raised: the crawl stops with one line."""
        if crawler is not None and not isinstance(exc, LocalError):
            crawler.patience = 0  # finished for this run (our machine's error is not the site's)
        stop = Stop.of(exc)
        log.info("%s", stop.text, exc_info=exc if log.isEnabledFor(logging.DEBUG) else None)
        self.stop(stop)

    # -- one turn of one origin ----------------------------------------------------------
    async def _turn(self, crawler: OriginCrawler) -> float | None:
        """One thing for this origin; when it may go again, or None (ended early: URLs given up)."""
        at = await self._step(crawler)
        if at is None and crawler.gave_up and not self.turns.stopping:
            return await self._give_up(crawler)
        return at

    async def _give_up(self, crawler: OriginCrawler) -> float | None:
        """Record a batch of the URLs an origin given up has left (ORIGIN_GIVEN_UP, no budget)."""
        await self.turns.settled(crawler)  # take_todo must not see its last URL as untaken
        left = crawler.todo or await self.db.take_todo(
            crawler.origin, self.run_id, max(1, self.strategy.todo_batch),
            self.steering.due_time())
        crawler.todo = []
        for action in outcome.given_up(left, crawler, clock.now()):
            await self._record(crawler, action, budgeted=False)
        return time.monotonic() if left else None

    async def _step(self, crawler: OriginCrawler) -> float | None:
        """The turn's one thing: robots.txt, or the next candidate's crawl action."""
        if crawler.patience <= 0:
            crawler.ending = crawler.ending or Ending(EndKind.OUT_OF_PATIENCE, "out of patience")
            return None
        if not self.steering.owns(crawler.origin):
            return None
        if self.robots.due(crawler):
            if time.monotonic() < crawler.next_request_at:
                return crawler.next_request_at
            if not await self.robots.load_stored(crawler):
                await self.turns.settled(crawler)  # its settlement, then robots.txt's rules
                await self.robots.fetch(crawler, self._get_robots)
                return None if crawler.patience <= 0 else crawler.next_request_at
        if (ending := outcome.ending(crawler, self.config)) is not None:
            await self.turns.settled(crawler)  # its last action's settlement, then the ending
            crawler.ending = ending
            return None
        if crawler.origin not in self._opened:
            self._opened.add(crawler.origin)
            self.db.add_links(crawler.origin,
                              self.links.opened(crawler.origin, list(crawler.state.sitemaps)))
        candidate = await self._next_candidate(crawler)
        if candidate is None or not self.steering.owns(crawler.origin):
            return None
        if time.monotonic() < crawler.next_request_at:
            crawler.todo.insert(0, candidate)
            return crawler.next_request_at
        if not await self._crawl(crawler, candidate):
            crawler.todo.insert(0, candidate)
            return None
        return None if crawler.patience <= 0 else crawler.next_request_at

    async def _get_robots(self, url: str) -> HttpResponse:
        """One request of robots.txt or of one of its redirects, as a request of its origin."""
        self.stats.requests += 1
        async with self.gate.request(origin_of(url)):
            resp = await self.fetcher.get(url, max_body=self.config.robots.max_size, truncate=True)
        if self.warc is not None:  # archived, as Heritrix does (docs/warc.md)
            self.warc.fetched(self.db, resp, self.config.robots.max_size)
        return resp

    async def _next_candidate(self, crawler: OriginCrawler) -> Candidate | None:
        """The next URL to fetch: refill the todo list, log the ones policy or robots refuse."""
        while not self.turns.stopping:
            if not crawler.todo:  # its last URL recorded first: take_todo writes nothing
                await self.turns.settled(crawler)
                batch = todo_batch(crawler, self.strategy.todo_batch, self.config.politeness)
                crawler.todo = await self.db.take_todo(crawler.origin, self.run_id, batch,
                                                       self.steering.due_time())
                if not crawler.todo:
                    return None
            if self._spent(take=True):  # one of the budget, until its action is recorded
                return None
            candidate = crawler.todo.pop(0)
            robots = await self.robots.judge(crawler, candidate, self.steering.policy)
            refused = outcome.refusal(candidate.url, candidate.depth, self.steering.policy,
                                      robots, crawler.shapes)
            if refused is None:
                return candidate
            action = CrawlAction(candidate, crawler.origin, refused.exit_code, clock.now(),
                                 detail=refused.rule)
            await self._record(crawler, action)
        return None

    def _spent(self, take: bool = False) -> bool:
        """Stop the crawl when --max-actions is used up (the URLs taken count)."""
        if (stop := self.stats.spent(self.config.max_actions, take)) is not None:
            self.stop(stop)
        return stop is not None

    # -- one crawl action ----------------------------------------------------------------
    async def _crawl(self, crawler: OriginCrawler, candidate: Candidate) -> bool:
        """Fetch one URL (conditionally), read the answer and body, record it. False: lease lost."""
        if self.steering.fleet is not None:
            # committed before the next request leaves: a frozen worker costs one (distributed.md)
            await self.turns.settled(crawler)
            await self.db.written(crawler.origin)
        action = CrawlAction(candidate, crawler.origin, ExitCode.OK, clock.now())
        started = time.monotonic()
        result: outcome.Answer
        try:
            async with self.gate.request(crawler.origin):
                if not self.steering.owns(crawler.origin):
                    return False
                self.stats.requests += 1
                crawler.pages_this_run += 1
                result = await self.fetcher.get(
                    candidate.request_url or candidate.url, headers=outcome.headers_of(candidate),
                    keep_alive=outcome.keeps_alive(crawler, self.config))
        except FetchError as exc:
            result = exc
        answered = time.monotonic()
        # a page goes to the page worker now, while the origin's last one is recorded
        page = self.content.analysis(candidate.url, result) if self._read_beside else None
        await self.turns.settled(crawler)  # the origin's last action first: its decisions hold
        started += time.monotonic() - answered  # (that wait is not this action's)
        reading: outcome.Reading | None = None
        try:
            reading = self._outcome(crawler, action, result, answered)
        except Exception as exc:  # a bug must not stop the origin: the URL gets an exit code
            action = internal_error(action, exc)
        # the delay runs from the server's answer: our own work on the page is not the site's
        delay = delay_for(crawler, self.config.politeness)
        crawler.next_request_at = max(crawler.next_request_at, answered + delay)
        end = self._end(crawler, action, result, reading, started, page)
        if reading is None or reading.next is outcome.Next.NOTHING or not self._read_beside:
            await end  # an error's settlement (patience, backoff) holds for the next request
        else:  # the page is parsed and recorded while the origin's next request goes
            await self.turns.beside(crawler, end)
        return True

    def _outcome(self, crawler: OriginCrawler, action: CrawlAction, result: outcome.Answer,
                 now: float) -> outcome.Reading:
        """What the answer says: exit code, what to read of the body, the origin's pause."""
        wall, conditional = clock.now(), outcome.validators(action.candidate) is not None
        reading = outcome.read(action.candidate.url, result, crawler, self.config, now, wall,
                               backoff_jitter(), action.candidate.request_url, conditional)
        action.exit_code, action.detail = reading.exit_code, reading.detail
        if reading.again is not None:  # a redirect to itself: its Location asked next
            crawler.todo.insert(0, action.candidate.asked_as(reading.again, reading.cookie))
        if reading.pause is not None:  # rate limited, or the server failed: it backs off
            pause(crawler, reading.backoff_level, reading.pause, now)
            crawler.state.backoff_until = wall + reading.pause
            action.origin_state = crawler.state
        if not isinstance(result, FetchError):
            crawler.answered_in(result.elapsed)
            self.stats.responded(result.elapsed, len(result.body))
        return reading

    async def _end(self, crawler: OriginCrawler, action: CrawlAction, result: outcome.Answer,
                   reading: outcome.Reading | None, started: float,
                   page: SentPage | None) -> None:
        """The body read (content.py; the page worker parses a page; of a response cut short,
        what came), the action recorded."""
        if reading is not None:
            try:
                await self.content.read(action, reading, result, page, crawler.robots)
            except StoreError:
                raise  # the database failed: the crawl stops (_stop_for)
            except Exception as exc:  # a bug must not stop the origin: the URL gets an exit code
                action = internal_error(action, exc)
        if page is not None:
            page.cancel()  # unread (an internal error): its answer is dropped
        action.elapsed = time.monotonic() - started
        await self._record(crawler, action)
        if self.strategy.finished():
            self.stop(Stop(StopKind.GOAL, "the strategy reached its goal"))

    async def _record(self, crawler: OriginCrawler, action: CrawlAction,
                      budgeted: bool = True) -> None:
        """Settle the action, tell the strategy about errors, write it all in one transaction."""
        settled = outcome.settle(action, crawler, self.config)
        crawler.patience, crawler.ending = settled.patience, settled.ending
        action.retry = settled.retry
        if settled.reset_backoff:
            crawler.state.backoff_until, crawler.state.backoff_level = 0.0, 0
            action.origin_state = crawler.state
        self.links.ended(action, crawler.state)  # request_error, what was scheduled, metadata
        if settled.recrawl_interval is not None:
            action.recrawl_interval = settled.recrawl_interval
            action.next_due = action.started + settled.recrawl_interval
        await self.db.record(action, self.run_id)
        self.content.recorded(action)  # a canonical URL named: now in the database
        if self.warc is not None:
            self.warc.recorded(self.db, action)
        self.stats.recorded(action, budgeted)  # ORIGIN_GIVEN_UP costs no --max-actions budget
        self._spent()  # now, not when this origin's next turn comes

    async def _housekeeping(self) -> None:
        """Commit the writes group commit held back, and report progress twice a second."""
        tick = max(0.02, min(0.5, self.config.commit_interval or 0.5))
        reported = 0.0
        while True:
            if self.on_progress is not None and time.monotonic() - reported >= 0.5:
                reported = time.monotonic()
                self.on_progress(self.stats)
            await asyncio.sleep(tick)
            self.db.flush_group(self.config.commit_interval)  # a group open that long


def internal_error(action: CrawlAction, exc: Exception) -> CrawlAction:
    """A bug raised while reading the answer: logged, and the URL's exit code INTERNAL_ERROR."""
    log.warning("internal error on %s: %s", action.candidate.url, describe(exc))
    log.debug("internal error", exc_info=exc)
    return outcome.internal_error(action, describe(exc))
