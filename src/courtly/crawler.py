"""The crawl loop: origin crawlers take turns through the penalty box; one URL, top to bottom.

Follow a URL: `_turn` (robots.txt first: robots_cache.py) → `_next_candidate` (todo list,
outcome.refusal) → `_crawl` (fetch; outcome.read; content.py reads the body, links.py its links)
→ `_record` (outcome.settle; one store transaction). See docs/crawl-loop.md, architecture.md.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from typing import Protocol

from courtly import clock, outcome
from courtly.config import CrawlConfig
from courtly.content import ContentReader
from courtly.errors import describe
from courtly.fetch import Fetcher, FetchError, HttpResponse, LocalError
from courtly.gate import Gate
from courtly.links import Links, request_of
from courtly.model import COMPLETED, Candidate, CrawlAction, ExitCode, OriginState
from courtly.policy import Policy, ShapeBudget
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
from courtly.store import Store, StoreError
from courtly.store.base import Write
from courtly.store.database import Database, StrategyStore
from courtly.strategy import CrawlingStrategy, StoreContext
from courtly.urls import host_of, origin_of
from courtly.warc import CrawlArchive

log = logging.getLogger("courtly")


class Fleet(Protocol):
    """The fleet (distributed.Worker); `follow` drives rescope, take_over, fleet_finished.

    `join` runs on the database thread; `lease` gives the (partition, epoch) a write for an
    origin is fenced with; `refused` hears of writes the database refused (a lease was lost).
    """

    def join(self) -> int: ...
    def owns(self, origin: str) -> bool: ...
    def lease(self, origin: str) -> tuple[int, int] | None: ...
    def refused(self, writes: list[Write]) -> None: ...
    def new_origin(self, origin: str) -> None: ...
    async def follow(self, crawl: Crawler) -> None: ...


class Crawler:
    """Runs one crawl over the configured origins until done, out of budget, or stopped."""

    def __init__(
        self, config: CrawlConfig, store: Store, strategy: CrawlingStrategy,
        on_progress: Callable[[CrawlStats], None] | None = None, fleet: Fleet | None = None,
    ) -> None:
        self.config = config
        self.fleet = fleet  # distributed mode: the origins our leases give us
        self._fleet_done = False
        self.store = store
        self.db = Database(store, fleet.lease, fleet.refused, self._database_failed) if fleet \
            else Database(store)
        self.strategy = strategy
        self.origins = store.configured_origins()
        self.policy = Policy(config.policies, config.traps, [o + "/" for o in self.origins])
        self.stats = CrawlStats(origins_total=len(self.origins))
        self.on_progress = on_progress
        keys = key_of(config.politeness.politeness_key, lambda h, p: self.fetcher.address_of(h, p))
        self.turns = Turns(config.concurrency, self._turn, self._stop_for, self.stats, keys)
        self.crawlers = self.turns.crawlers
        self.gate = Gate(self.crawlers, config.politeness)  # whichever origin asks (gate.py)
        self._loop: asyncio.AbstractEventLoop
        self.fetcher: Fetcher
        self._opened: set[str] = set()  # origins whose strategy.origin_opened was called
        self.robots = RobotsCache(config, self.db)
        self.links = Links(strategy, self.db, self.policy, config.normalize, self._admit)
        self.content = ContentReader(config, self.db, strategy, self.links)
        strategy.bind(StoreContext(StrategyStore(self.db), self.turns.live_state))
        self.warc = CrawlArchive.of(config.warc, store)  # crawl --warc, as actions are recorded

    async def run(self) -> CrawlStats:
        """Crawl until every origin is finished, the budget is spent, or a signal arrives."""
        self._loop = loop = asyncio.get_running_loop()
        try:
            self.run_id = await self.db.call(
                self.fleet.join if self.fleet is not None else self.store.begin_run)
        except BaseException:
            self.db.close()
            raise
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop, StopKind.SIGNAL, f"stopped by {sig.name}")
        try:  # a signal during the shut-down is handled too: it is already stopping
            return await self._crawl_until_done()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    async def _crawl_until_done(self) -> CrawlStats:
        """Dispatch turns until done or stopped, then drain, commit and close the strategy."""
        # the address guard lets through the seeds' own hosts, not the origins found in scope
        hosts = {host_of(o + "/") for o in await self.db.call(self.store.seed_origins)}
        async with Fetcher.for_crawl(self.config, hosts) as self.fetcher:
            for origin in self.origins if self.fleet is None else ():
                self._add_crawler(origin, await self.db.load_origin(origin))
            self.store.commit_interval = self.config.commit_interval
            jobs = [self._housekeeping(), *([self.fleet.follow(self)] if self.fleet else [])]
            try:
                await self.turns.run(lambda: self.fleet is not None and not self._fleet_done, jobs)
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
                await self.db.call(self.store.finish_run, self.run_id)
            try:
                self.strategy.close()
            except StoreError:
                raise
            except Exception as exc:  # the strategy's bug: one line, exit status 1
                text = f"internal error: strategy close(): {describe(exc)}"
                self.stats.stop = Stop(StopKind.INTERNAL_ERROR, text)
            await self.db.flush()  # what the strategy saved
        finally:
            self.db.close()
        if self.on_progress:
            self.on_progress(self.stats)
        return self.stats

    def stop(self, kind: StopKind, text: str) -> None:
        """Stop dispatching new turns; in-flight requests get a short grace period."""
        if self.stats.stop is None:
            self.stats.stop = Stop(kind, text)
        self.turns.stop()

    def _add_crawler(self, origin: str, state: OriginState, taken_over: bool = False) -> None:
        traps, rules = self.config.traps, self.config.politeness
        crawler = OriginCrawler(origin, state, patience=rules.patience, shapes=ShapeBudget(
            traps.max_actions_per_shape, traps.shape_depth_slack))
        if taken_over:  # from another worker, whose last request may be recent
            crawler.next_request_at = time.monotonic() + delay_for(crawler, rules)
        self.turns.add(crawler, time.monotonic() + max(0.0, state.backoff_until - clock.now()))

    def _stop_for(self, crawler: OriginCrawler | None, exc: Exception) -> None:
        """A turn (of `crawler`) or a helper task raised: the crawl stops with one line."""
        if crawler is not None and not isinstance(exc, LocalError):
            crawler.patience = 0  # finished for this run (our machine's error is not the site's)
        stop = Stop.of(exc)
        log.info("%s", stop.text, exc_info=exc if log.isEnabledFor(logging.DEBUG) else None)
        self.stop(stop.kind, stop.text)

    def _admit(self, url: str, origin: str) -> None:
        """A link to `origin`: a finished crawler is reopened, a new origin in scope added."""
        known = self.crawlers.get(origin)
        if known is not None:
            if known.finished and self.fleet is None:
                self.turns.reopen(known)
        elif self.policy.origin_for(url) == origin:
            if self.fleet is not None:
                self.fleet.new_origin(origin)  # crawled by its partition's owner
            else:
                self.db.add_origins([origin])
                self._add_crawler(origin, self.db.wait(self.store.load_origin, origin))

    # -- one turn of one origin ----------------------------------------------------------
    async def _turn(self, crawler: OriginCrawler) -> float | None:
        """Do one thing for this origin; when it may go again, or None when finished (an origin
        that ended early first gives up the URLs it has left, a todo list a turn)."""
        at = await self._step(crawler)
        if at is None and crawler.ending and not self.turns.stopping:
            return await self._give_up(crawler)
        return at

    async def _give_up(self, crawler: OriginCrawler) -> float | None:
        """Record a batch of the URLs an origin given up has left (ORIGIN_GIVEN_UP, no budget)."""
        left = crawler.todo or await self.db.take_todo(
            crawler.origin, self.run_id, max(1, self.strategy.todo_batch), self.due_time())
        crawler.todo = []
        for action in outcome.given_up(left, crawler, clock.now()):
            await self._record(crawler, action, budgeted=False)
        return time.monotonic() if left else None

    async def _step(self, crawler: OriginCrawler) -> float | None:
        """The turn's one thing: robots.txt, or the next candidate's crawl action."""
        if crawler.patience <= 0:
            crawler.ending = crawler.ending or Ending(EndKind.OUT_OF_PATIENCE, "out of patience")
            return None
        if not self._owned(crawler):
            return None
        if self.robots.due(crawler):
            if time.monotonic() < crawler.next_request_at:
                return crawler.next_request_at
            if not self.robots.load_stored(crawler):
                await self.robots.fetch(crawler, self._get_robots)
                return None if crawler.patience <= 0 else crawler.next_request_at
        if (ending := outcome.ending(crawler, self.config)) is not None:
            crawler.ending = ending
            return None
        if crawler.origin not in self._opened:
            self._opened.add(crawler.origin)
            self.db.add_links(crawler.origin,
                              self.links.opened(crawler.origin, list(crawler.state.sitemaps)))
        candidate = await self._next_candidate(crawler)
        if candidate is None or not self._owned(crawler):
            return None
        if time.monotonic() < crawler.next_request_at:
            crawler.todo.insert(0, candidate)
            return crawler.next_request_at
        action = await self._crawl(crawler, candidate)
        if action is None:
            crawler.todo.insert(0, candidate)
            return None
        await self._record(crawler, action)
        if self.strategy.finished():
            self.stop(StopKind.GOAL, "the strategy reached its goal")
        return None if crawler.patience <= 0 else crawler.next_request_at

    async def _get_robots(self, url: str) -> HttpResponse:
        """One request of robots.txt or of one of its redirects, as a request of its origin."""
        self.stats.requests += 1
        async with self.gate.request(origin_of(url)):
            return await self.fetcher.get(url, max_body=self.config.robots.max_size, truncate=True)

    def _owned(self, crawler: OriginCrawler) -> bool:
        """In a fleet: our lease on the origin's partition still holds (else the turn ends: the
        partition is being handed over, or the lease is in doubt)."""
        return self.fleet is None or self.fleet.owns(crawler.origin)

    async def _next_candidate(self, crawler: OriginCrawler) -> Candidate | None:
        """The next URL to fetch: refill the todo list, log the ones policy or robots refuse."""
        while not self.turns.stopping:
            if self._stop_if_budget_spent():
                return None
            if not crawler.todo:
                batch = todo_batch(crawler, self.strategy.todo_batch, self.config.politeness)
                crawler.todo = await self.db.take_todo(crawler.origin, self.run_id, batch,
                                                       self.due_time())
                if not crawler.todo:
                    return None
            candidate = crawler.todo.pop(0)
            refused = outcome.refusal(candidate.url, candidate.depth, self.policy, crawler.robots,
                                      crawler.shapes)
            if refused is None:
                return candidate
            action = CrawlAction(candidate, crawler.origin, refused.exit_code, clock.now(),
                                 detail=refused.rule)
            await self._record(crawler, action)
        return None

    def due_time(self) -> float:
        """Candidates due before this wall-clock time are taken (all with --force-recrawl)."""
        return float("inf") if self.config.force_recrawl else clock.now()

    def _stop_if_budget_spent(self) -> bool:
        """Stop the crawl when --max-actions is used up (actions in flight count)."""
        budget = self.config.max_actions
        if budget and self.stats.actions + self.stats.in_flight - 1 >= budget:
            self.stop(StopKind.BUDGET, f"budget of {budget} crawl actions spent")
            return True
        return False

    # -- one crawl action ----------------------------------------------------------------
    async def _crawl(self, crawler: OriginCrawler, candidate: Candidate) -> CrawlAction | None:
        """Fetch one URL (conditionally when its validators are known) and read the answer;
        None: in a fleet, the origin's lease was lost while waiting at its gate."""
        action = CrawlAction(candidate, crawler.origin, ExitCode.OK, clock.now())
        started = time.monotonic()
        result: outcome.Answer
        try:
            async with self.gate.request(crawler.origin):
                if not self._owned(crawler):
                    return None
                self.stats.requests += 1
                crawler.pages_this_run += 1
                result = await self.fetcher.get(
                    candidate.url, headers=outcome.validators(candidate),
                    keep_alive=outcome.keeps_alive(crawler, self.config))
        except FetchError as exc:
            result = exc
        answered = time.monotonic()
        try:
            await self._read(crawler, action, result, answered)
        except StoreError:
            raise  # the database failed: the crawl stops (_stop_for)
        except Exception as exc:  # a bug must not stop the origin: the URL gets an exit code
            log.warning("internal error on %s: %s", candidate.url, describe(exc))
            log.debug("internal error", exc_info=exc)
            action = outcome.internal_error(action, describe(exc))
        action.elapsed = time.monotonic() - started
        # the delay runs from the server's answer: our own work on the page is not the site's
        delay = delay_for(crawler, self.config.politeness)
        crawler.next_request_at = max(crawler.next_request_at, answered + delay)
        return action

    async def _read(self, crawler: OriginCrawler, action: CrawlAction, result: outcome.Answer,
                    now: float) -> None:
        """The outcome of the answer, then its body: exit code, results, the origin's pause."""
        wall = clock.now()
        reading = outcome.read(action.candidate.url, result, crawler, self.config, now, wall,
                               backoff_jitter())
        action.exit_code, action.detail = reading.exit_code, reading.detail
        if reading.pause is not None:  # rate limited, or the server failed: it backs off
            pause(crawler, reading.backoff_level, reading.pause, now)
            crawler.state.backoff_until = wall + reading.pause
            action.origin_state = crawler.state
        if isinstance(result, FetchError):
            return
        crawler.answered_in(result.elapsed)
        self.stats.responded(result.elapsed, len(result.body))
        await self.content.read(action, reading, result)

    async def _record(self, crawler: OriginCrawler, action: CrawlAction,
                      budgeted: bool = True) -> None:
        """Settle the action, tell the strategy about errors, write it all in one transaction."""
        settled = outcome.settle(action, crawler, self.config)
        crawler.patience, crawler.ending = settled.patience, settled.ending
        action.retry = settled.retry
        if settled.reset_backoff:
            crawler.state.backoff_until, crawler.state.backoff_level = 0.0, 0
            action.origin_state = crawler.state
        if action.exit_code not in COMPLETED and not action.retry:
            self.strategy.request_error(request_of(action.candidate), str(action.exit_code))
        if not action.links:
            action.links = self.links.scheduled()
        if settled.recrawl_interval is not None:
            action.recrawl_interval = settled.recrawl_interval
            action.next_due = action.started + settled.recrawl_interval
        await self.db.record(action, self.run_id)
        if self.warc is not None:  # read back as written (the database thread's order)
            self.db.later(self.warc.keep, action).add_done_callback(self._archived)
        self.strategy.domain_metadata.flush()
        self.stats.recorded(action, budgeted)  # ORIGIN_GIVEN_UP costs no --max-actions budget
        self._stop_if_budget_spent()  # now, not when this origin's next turn comes

    def rescope(self, origins: list[str]) -> None:
        """(Fleet.follow) The configured origins changed (seeds were added): the scope follows."""
        if origins != self.origins:
            self.origins = origins
            self.policy = self.links.policy = Policy(self.config.policies, self.config.traps,
                                                     [o + "/" for o in origins])
            self.stats.origins_total = len(origins)

    async def take_over(self, origin: str) -> None:
        """An origin of our leases with work: crawl it (the last owner's request may be recent)."""
        if origin not in self.crawlers:
            self._add_crawler(origin, await self.db.load_origin(origin), taken_over=True)

    def fleet_finished(self) -> None:
        """The fleet has no work left: the loop ends when its turns do."""
        self._fleet_done = True
        self.turns.wake()

    def _archived(self, done: asyncio.Future[str | None]) -> None:
        """A crawl action's WARC records were written, or that failed: the crawl stops."""
        exc = done.exception()
        if isinstance(exc, Exception):
            self._stop_for(None, exc)
        elif (failed := done.result()) is not None:
            self.stop(StopKind.ARCHIVE_ERROR, failed)

    def _database_failed(self, exc: StoreError) -> None:
        """The database thread gave up (the server stayed away past the limit): stop."""
        self._loop.call_soon_threadsafe(self._stop_for, None, exc)

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

