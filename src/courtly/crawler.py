"""The crawl loop: origin crawlers take turns through the penalty box; one URL, top to bottom.

Follow a URL: `_turn` → `_next_candidate` (todo list, policy, robots.txt) → `_crawl` (fetch,
classify) → `_crawl_page` (parse, canonical, meta robots, duplicates) → `_links` (strategy,
scope) → `_record` (one store transaction).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import traceback
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from courtly import clock, dedup, sitemaps
from courtly.config import CrawlConfig
from courtly.fetch import Fetcher, FetchError, LocalError, Response, one_line
from courtly.model import (
    COMPLETED,
    COSTS_PATIENCE,
    RETRY_IN_RUN,
    Candidate,
    CrawlAction,
    ExitCode,
    Link,
    LinkState,
)
from courtly.pageworker import PageSettings, PageWorker
from courtly.policy import Policy, ShapeBudget
from courtly.recrawl import next_due
from courtly.robots import RobotsRules, product_token, rules_for_status
from courtly.scheduler import (
    OriginCrawler,
    PenaltyBox,
    delay_for,
    effective_crawl_delay,
    rate_limit_pause,
    retry_after_seconds,
)
from courtly.store import OriginState, Store, StoreError
from courtly.strategy import CrawlingStrategy, Request, StoreContext, breadth_first_score
from courtly.strategy import Response as StrategyResponse
from courtly.urls import host_of, normalize, origin_of

if TYPE_CHECKING:
    from courtly.distributed import Worker

log = logging.getLogger("courtly")

TODO_BATCH = 64
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_HTML_TYPES = ("text/html", "application/xhtml+xml")


@dataclass
class CrawlStats:
    """Live counters for progress display and the end-of-crawl summary."""

    started: float = field(default_factory=time.monotonic)
    actions: int = 0
    requests: int = 0
    exit_codes: Counter[str] = field(default_factory=Counter)
    origins_total: int = 0
    origins_finished: int = 0
    in_flight: int = 0
    stop_reason: str = ""
    #: origins finished for a reason other than having no work left: origin → the reason
    stopped_early: dict[str, str] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Crawl actions per second since the start."""
        return self.actions / max(1e-9, time.monotonic() - self.started)


class Crawler:
    """Runs one crawl over the configured origins until done, out of budget, or stopped."""

    def __init__(
        self,
        config: CrawlConfig,
        store: Store,
        strategy: CrawlingStrategy,
        on_progress: Callable[[CrawlStats], None] | None = None,
        assignment: Worker | None = None,
    ) -> None:
        self.config = config
        self.assignment = assignment  # distributed mode: the origins our leases give us
        self._fleet_done = False
        self.store = store
        self.strategy = strategy
        self.token = product_token(config.user_agent)
        self.origins = store.configured_origins()
        self.policy = Policy(config.policies, config.traps, [o + "/" for o in self.origins])
        self.stats = CrawlStats(origins_total=len(self.origins))
        self.box = PenaltyBox()
        self.crawlers: dict[str, OriginCrawler] = {}
        self.on_progress = on_progress
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(config.concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop
        self.run_id = 0
        self.fetcher: Fetcher
        self._opened: set[str] = set()  # origins whose strategy.origin_opened was called
        limits = config.limits
        self._base_link_handlers = strategy.has_base_link_handlers()
        self.pages = PageWorker(  # parse_html and links, in a worker process (pageworker.py)
            PageSettings(self.token, limits.max_links_per_page, limits.max_parse_size,
                         config.dedup.near, config.normalize, config.store_content,
                         anchors=not self._base_link_handlers),
            config.parse_workers,
        )
        strategy.bind(StoreContext(store, self._live_state))

    def _live_state(self, origin: str) -> OriginState | None:
        crawler = self.crawlers.get(origin)
        return None if crawler is None else crawler.state

    # -- the run -----------------------------------------------------------------------
    async def run(self) -> CrawlStats:
        """Crawl until every origin is finished, the budget is spent, or a signal arrives."""
        fleet = self.assignment
        self.run_id = fleet.join() if fleet is not None else self.store.begin_run()
        loop = self._loop = asyncio.get_running_loop()  # kept: 3.11 asks getpid() on each lookup
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop, f"stopped by {signal.Signals(sig).name}")
        try:  # a signal during the shut-down is handled too: it is already stopping
            return await self._crawl_until_done()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    async def _crawl_until_done(self) -> CrawlStats:
        """Dispatch turns until done or stopped, then drain, commit and close the strategy."""
        fleet = self.assignment
        # the address guard lets through the seeds' own hosts, not the origins found in scope
        hosts = {host_of(o + "/") for o in self.store.seed_origins()}
        async with Fetcher(self.config.limits, self.config.user_agent, hosts) as self.fetcher:
            for origin in self.origins if fleet is None else ():
                self._add_crawler(origin)
            self.store.commit_interval = self.config.commit_interval
            progress = asyncio.create_task(self._housekeeping())
            follow = asyncio.create_task(self._follow_assignment()) if fleet else None
            try:
                await self._dispatch()
            finally:
                progress.cancel()
                if follow is not None:
                    follow.cancel()
                await self._drain()
                self.pages.close()
        if not self.stats.stop_reason:
            self.stats.stop_reason = "finished: no origin has work left"
            self.store.finish_run(self.run_id)
        self.store.flush()
        try:
            self.strategy.close()
        except StoreError:
            raise
        except Exception as exc:  # the strategy's bug: one line, exit status 1
            self.stats.stop_reason = f"internal error: strategy close(): {_describe(exc)}"
        if self.on_progress:
            self.on_progress(self.stats)
        return self.stats

    def stop(self, reason: str) -> None:
        """Stop dispatching new turns; in-flight requests get a short grace period."""
        if not self.stats.stop_reason:
            self.stats.stop_reason = reason
        self._stop.set()
        self._wake.set()

    def _add_crawler(self, origin: str) -> None:
        state = self.store.load_origin(origin)
        crawler = OriginCrawler(origin, state, patience=self.config.politeness.patience,
                                shapes=ShapeBudget(self.config.traps.max_actions_per_shape,
                                                   self.config.traps.shape_depth_slack))
        self.crawlers[origin] = crawler
        wait = max(0.0, state.backoff_until - clock.now())
        self.box.push(crawler, time.monotonic() + wait)
        self._wake.set()

    async def _dispatch(self) -> None:
        """Release origins from the penalty box as their time comes, up to --concurrency."""
        while not self._stop.is_set():
            at = self.box.peek_time()
            if at is None:
                if not self._tasks and (self.assignment is None or self._fleet_done):
                    return
                self._wake.clear()
                await self._wait(None)
                continue
            delay = at - time.monotonic()
            if delay > 0:
                self._wake.clear()
                await self._wait(delay)
                continue
            await self._slots.acquire()
            if self._stop.is_set():
                self._slots.release()
                return
            crawler = self.box.pop()
            task = self._loop.create_task(self._run_turn(crawler))
            self._tasks.add(task)
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._wake.set()

    async def _wait(self, timeout: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _drain(self) -> None:
        """Let in-flight turns finish for a moment, then cancel them (their URLs stay queued)."""
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=2.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _run_turn(self, crawler: OriginCrawler) -> None:
        self.stats.in_flight += 1
        try:
            at = await self._turn(crawler)
        except StoreError as exc:
            log.info("database error: %s", exc)  # the stop reason: the summary's one line
            crawler.patience = 0  # a database error finishes the origin at once
            self.stop(f"database error: {exc}")
            at = None
        except LocalError as exc:  # our machine, not the site: its URL stays for the next run
            self.stop(f"local error: {exc.detail}")
            at = None
        except Exception as exc:  # a bug outside a page's handling: stop cleanly, say where
            crawler.patience = 0
            self._stop_for_bug(exc)
            at = None
        finally:
            self.stats.in_flight -= 1
            self._slots.release()
        if at is None:
            self._finish(crawler)
        else:
            self.box.push(crawler, at)
        self._wake.set()

    def _stop_for_bug(self, exc: Exception) -> None:
        """Stop with one line naming the exception and where it was raised (exit status 1)."""
        log.debug("internal error", exc_info=exc)
        self.stop(f"internal error: {_describe(exc)}")

    def _finish(self, crawler: OriginCrawler) -> None:
        crawler.finished = True
        self.stats.origins_finished += 1
        if crawler.finish_reason:
            self.stats.stopped_early[crawler.origin] = crawler.finish_reason
        log.info("%s finished: %s", crawler.origin, crawler.finish_reason or "done")

    def _reopen(self, crawler: OriginCrawler) -> None:
        """An origin that ran out of work gets new links: back into the penalty box."""
        if crawler.patience <= 0 or crawler.finish_reason or self._stop.is_set():
            return  # it gave up for this run
        crawler.finished = False
        self.stats.origins_finished -= 1
        self.box.push(crawler, max(time.monotonic(), crawler.next_request_at))
        self._wake.set()

    # -- one turn of one origin ----------------------------------------------------------
    async def _turn(self, crawler: OriginCrawler) -> float | None:
        """Do one thing for this origin; return when it may go again, or None when finished."""
        if crawler.patience <= 0:
            crawler.finish_reason = crawler.finish_reason or "out of patience"
            return None
        if self.assignment is not None and not self.assignment.owns(crawler.origin):
            return None  # its partition is being handed over (or our lease is in doubt)
        if self.config.robots.obey and (
            crawler.robots is None or time.monotonic() >= crawler.robots_expires
        ):
            if time.monotonic() < crawler.next_request_at:
                return crawler.next_request_at
            if not self._load_cached_robots(crawler):
                await self._fetch_robots(crawler)
                return None if crawler.patience <= 0 else crawler.next_request_at
        if effective_crawl_delay(crawler.state.crawl_delay, self.config.politeness) is None:
            crawler.finish_reason = f"Crawl-delay {crawler.state.crawl_delay}s is above the cap"
            return None
        if crawler.origin not in self._opened:
            self._opened.add(crawler.origin)
            self.strategy.origin_opened(crawler.origin, list(crawler.state.sitemaps))
            self.store.add_links(self._scheduled_links())
        candidate = self._next_candidate(crawler)
        if candidate is None:
            return None
        if time.monotonic() < crawler.next_request_at:
            crawler.todo.appendleft(candidate)
            return crawler.next_request_at
        action = await self._crawl(crawler, candidate)
        self._record(crawler, action)
        if self.strategy.finished():
            self.stop("the strategy reached its goal")
        return None if crawler.patience <= 0 else crawler.next_request_at

    def _next_candidate(self, crawler: OriginCrawler) -> Candidate | None:
        """The next URL to fetch: refill the todo list, log the ones policy or robots refuse."""
        traps = self.config.traps
        while not self._stop.is_set():
            if self._stop_if_budget_spent():
                return None
            if traps.max_pages_per_origin and crawler.pages_this_run >= traps.max_pages_per_origin:
                crawler.finish_reason = f"trap: max_pages_per_origin {traps.max_pages_per_origin}"
                return None
            if not crawler.todo:
                crawler.todo.extend(
                    self.store.take_todo(
                        crawler.origin, self.run_id, self.strategy.todo_batch or TODO_BATCH,
                        self._due_time(),
                    )
                )
                if not crawler.todo:
                    return None
            candidate = crawler.todo.popleft()
            verdict = self.policy.check(candidate.url, candidate.depth)
            if not verdict.allowed:
                self._record_blocked(
                    crawler, candidate, ExitCode.BLOCKED_URL_BY_LOCAL_POLICY, verdict.rule
                )
                continue
            if crawler.robots is not None and not crawler.robots.allowed(candidate.url):
                _, rule = crawler.robots.explain(candidate.url)
                self._record_blocked(crawler, candidate, ExitCode.BLOCKED_BY_ROBOTS_TXT, rule)
                continue
            verdict = crawler.shapes.spend(candidate.url, candidate.depth)
            if not verdict.allowed:
                self._record_blocked(
                    crawler, candidate, ExitCode.BLOCKED_BY_TRAP_BUDGET, verdict.rule
                )
                continue
            return candidate
        return None

    def _due_time(self) -> float:
        return float("inf") if self.config.force_recrawl else clock.now()

    def _stop_if_budget_spent(self) -> bool:
        """Stop the crawl when --max-actions is used up (actions in flight count)."""
        budget = self.config.max_actions
        if budget and self.stats.actions + self.stats.in_flight - 1 >= budget:
            self.stop(f"budget of {budget} crawl actions spent")
            return True
        return False

    def _record_blocked(
        self, crawler: OriginCrawler, candidate: Candidate, code: ExitCode, rule: str
    ) -> None:
        action = CrawlAction(candidate, crawler.origin, code, clock.now(), detail=rule)
        action.next_due = next_due(action, candidate, self.config.recrawl, self.config.robots)
        self._record(crawler, action)

    # -- robots.txt ----------------------------------------------------------------------
    def _load_cached_robots(self, crawler: OriginCrawler) -> bool:
        """Use the stored robots.txt if it has not expired (a resumed or repeated crawl)."""
        state = crawler.state
        if crawler.robots is not None or state.robots_fetched is None:
            return False
        age = clock.now() - state.robots_fetched
        if state.robots_status is None or age >= self.config.robots.expiry:
            return False
        crawler.robots = self._parse_robots(state.robots_status, state.robots_body or b"")
        crawler.robots_expires = time.monotonic() + self.config.robots.expiry - age
        return True

    def _parse_robots(self, status: int, body: bytes) -> RobotsRules:
        return rules_for_status(status, body, self.config.user_agent, self.config.robots.max_size)

    async def _fetch_robots(self, crawler: OriginCrawler) -> None:
        """Fetch /robots.txt (following up to 5 redirects) and apply RFC 9309's status rules."""
        rules = self.config.robots
        url = crawler.origin + "/robots.txt"
        status: int | None = None
        body, failure = b"", ""
        for _ in range(rules.max_redirects + 1):
            try:
                self.stats.requests += 1
                resp = await self.fetcher.get(url, max_body=rules.max_size, truncate=True)
            except FetchError as exc:
                log.info("%s: robots.txt unreachable: %s", crawler.origin, exc.detail)
                failure = exc.detail
                if exc.exit_code is ExitCode.BLOCKED_ADDRESS and url.startswith(crawler.origin):
                    # never contacted, so no robots.txt applies: each URL is then logged
                    # BLOCKED_ADDRESS by the address guard, without a request
                    crawler.robots = self._parse_robots(404, b"")
                    crawler.robots_expires = time.monotonic() + rules.expiry
                    return
                status = None
                break
            status, body = resp.status, resp.body
            location = resp.headers.get("location")
            if resp.status in _REDIRECTS and location:
                target = normalize(location, url)
                if target is None:
                    break
                url = target
                continue
            break
        self._apply_robots(crawler, status, body, failure)
        crawler.next_request_at = max(
            crawler.next_request_at,
            time.monotonic() + delay_for(crawler, self.config.politeness),
        )

    def _apply_robots(
        self, crawler: OriginCrawler, status: int | None, body: bytes, failure: str = ""
    ) -> None:
        """RFC 9309 status rules: 5xx/429/unreachable (failure says why) → stale copy or wait;
        else parse."""
        rules = self.config.robots
        state = crawler.state
        if status is None or status == 429 or status >= 500:
            state.robots_error = failure or f"status {status}"  # kept for `courtly check`
            stale = state.robots_fetched is not None and state.robots_status is not None and (
                clock.now() - state.robots_fetched < rules.stale_cache_limit
            ) and state.robots_status < 500
            if stale and state.robots_status is not None:
                crawler.robots = self._parse_robots(state.robots_status, state.robots_body or b"")
                crawler.robots_expires = time.monotonic() + min(rules.expiry, 60.0)
            else:
                crawler.robots = None  # unavailable: nothing is crawled until it recovers
                crawler.patience -= 1
                crawler.finish_reason = f"robots.txt unavailable ({state.robots_error})"
                pause = rate_limit_pause(crawler, None, self.config.politeness, time.monotonic())
                crawler.next_request_at = time.monotonic() + pause
            self.store.save_origin(state)
            return
        crawler.robots = self._parse_robots(status, body)
        crawler.robots_expires = time.monotonic() + rules.expiry
        crawler.finish_reason = ""
        state.robots_status, state.robots_body, state.robots_error = status, body, None
        state.robots_fetched = clock.now()
        state.crawl_delay = crawler.robots.crawl_delay
        state.sitemaps = list(crawler.robots.sitemaps)
        self.store.save_origin(state)

    # -- one crawl action ----------------------------------------------------------------
    async def _crawl(self, crawler: OriginCrawler, candidate: Candidate) -> CrawlAction:
        """Fetch one URL (conditionally when we know its validators) and classify the result."""
        action = CrawlAction(candidate, crawler.origin, ExitCode.OK, clock.now())
        headers = {}
        if candidate.etag:
            headers["If-None-Match"] = candidate.etag
        if candidate.last_modified:
            headers["If-Modified-Since"] = candidate.last_modified
        started = time.monotonic()
        self.stats.requests += 1
        crawler.pages_this_run += 1
        resp: Response | None = None
        try:
            resp = await self.fetcher.get(candidate.url, headers=headers or None)
        except FetchError as exc:
            action.exit_code, action.detail = exc.exit_code, exc.detail
        answered = time.monotonic()
        if resp is not None:
            crawler.response_times.append(resp.elapsed)
            try:
                await self._classify(crawler, action, resp)
            except StoreError:
                raise  # the database failed: the crawl stops (_run_turn)
            except Exception as exc:  # a bug must not stop the origin: the URL gets an exit code
                action = _internal_error(action, exc)
        action.elapsed = time.monotonic() - started
        # the delay runs from the server's answer: our own work on the page is not the site's
        delay = delay_for(crawler, self.config.politeness)
        crawler.next_request_at = max(crawler.next_request_at, answered + delay)
        code = action.exit_code
        if code in COSTS_PATIENCE:
            crawler.patience -= 1
            crawler.finish_reason = f"out of patience after {code}: {action.detail}"
        elif action.http_status is not None:
            crawler.patience = self.config.politeness.patience
            crawler.finish_reason = ""
        if code in RETRY_IN_RUN and candidate.attempts < self.config.politeness.max_retries:
            action.retry = True
        return action

    async def _classify(
        self, crawler: OriginCrawler, action: CrawlAction, resp: Response
    ) -> None:
        """Exit code and results from the HTTP status, headers and body."""
        status = resp.status
        action.http_status = status
        action.content_type = resp.headers.get("content-type")
        action.content_length = len(resp.body)
        action.etag = resp.headers.get("etag")
        action.last_modified = resp.headers.get("last-modified")
        if status in (429, 503):
            action.exit_code = ExitCode.RATE_LIMITED
            wait = retry_after_seconds(resp.headers.get("retry-after"), clock.now())
            pause = rate_limit_pause(crawler, wait, self.config.politeness, time.monotonic())
            crawler.next_request_at = time.monotonic() + pause
            crawler.state.backoff_until = clock.now() + pause
            action.origin_state = crawler.state
            action.detail = f"paused {pause:.1f}s"
        elif status in _REDIRECTS:
            location = resp.headers.get("location", "").strip()
            url = action.candidate.url
            target = normalize(location, url, self.config.normalize) if location else None
            action.exit_code, action.redirect_target = ExitCode.REDIRECT, target
            most = self.config.limits.max_redirect_chain
            if target is None:
                action.detail = f"no usable Location ({one_line(location) or 'none'}): not queued"
            elif self.store.redirect_chain(url, most) >= most:
                # the hop is recorded, its target is not queued: an endless chain stops here
                action.exit_code = ExitCode.TOO_MANY_REDIRECTS
                action.detail = f"redirect chain longer than {most} hops; target not queued"
            else:
                self._links(action, [Request(target, action.candidate.depth)])
        elif status == 304:
            action.exit_code = ExitCode.NOT_MODIFIED
        elif status >= 600:
            action.exit_code = ExitCode.PROTOCOL_ERROR
            action.detail = f"unexpected status {status}"
        elif status >= 500:
            action.exit_code = ExitCode.HTTP_SERVER_ERROR
        elif status >= 400:
            action.exit_code = ExitCode.HTTP_CLIENT_ERROR
        elif status >= 300 or status < 200:
            action.exit_code = ExitCode.PROTOCOL_ERROR
            action.detail = f"unexpected status {status}"
        elif not (action.content_type or "text/html").lower().startswith(_HTML_TYPES):
            action.exit_code = ExitCode.UNSUPPORTED_CONTENT
            action.content_hash = dedup.exact_fingerprint(resp.body)
            if sitemaps.looks_like_sitemap(action.candidate.url, action.content_type, resp.body):
                self._crawl_sitemap(action, resp)
        else:
            await self._crawl_page(action, resp)
        if action.exit_code is not ExitCode.RATE_LIMITED and crawler.state.backoff_until:
            crawler.state.backoff_until = 0.0
            action.origin_state = crawler.state

    async def _crawl_page(self, action: CrawlAction, resp: Response) -> None:
        """An HTML page: directives, canonical, duplicates, content and links."""
        url = action.candidate.url
        page = await self.pages.analyse(
            url, resp.body, action.content_type, resp.headers.get("x-robots-tag", "")
        )
        if page.canonical:
            action.exit_code = ExitCode.NOT_CANONICAL
            action.canonical = page.canonical
            self._links(action, [Request(page.canonical, action.candidate.depth)])
            return
        action.content_hash = dedup.exact_fingerprint(resp.body)
        if page.noindex:
            action.exit_code = ExitCode.NOINDEX
        elif self.config.dedup.exact and (
            original := self.store.find_hash(action.content_hash, url)
        ):
            action.exit_code = ExitCode.DUPLICATE_CONTENT
            action.duplicate_of = original
            action.detail = f"exact duplicate of {original}"
            if not self.config.dedup.follow_links_of_exact_duplicates:
                return
        elif self.config.dedup.near and self._near_duplicate(action, page.near_signature):
            if not self.config.dedup.follow_links_of_near_duplicates:
                return
        else:
            action.content = page.content
        self.strategy.page_crawled(
            StrategyResponse(self._request(action.candidate), resp.status, str(action.exit_code),
                             resp.headers, resp.body, page.title)
        )
        if page.nofollow:
            action.detail = "nofollow"
            return
        self._page_links(action, page.links)

    def _page_links(self, action: CrawlAction, links: list[tuple[str, str]]) -> None:
        """A page's links (normalized, with their anchor text) in scope, through the strategy.

        A strategy with the base class's link handlers gets their result without the objects:
        the links never crawled, with `breadth_first_score` (no per-link Request and Scheduled),
        less those already candidates with at least that score (their upsert would change
        nothing, and their origin has its crawler since they were added).
        """
        depth = action.candidate.depth + 1
        in_scope = self.policy.in_scope
        if not self._base_link_handlers:
            found = [Request(url, depth, meta={"anchor": text})
                     for url, text in links if in_scope(url)]
            self._links(action, found, vetted=True)
            return
        score = breadth_first_score(depth)
        unsettled = self.store.unsettled([url for url, _ in links if in_scope(url)], score)
        action.links.extend(self._scheduled_links())  # what page_crawled scheduled, if anything
        action.links.extend(self._link(url, depth, score) for url in unsettled)

    def _request(self, candidate: Candidate) -> Request:
        return Request(candidate.url, candidate.depth, candidate.score, state=LinkState.QUEUED)

    def _near_duplicate(self, action: CrawlAction, signature: bytes | None) -> bool:
        """A similar enough OK page (MinHash signature of the text) makes this a duplicate."""
        action.near_signature = signature
        if action.near_signature is None:
            return False
        similar = self.store.find_similar(
            action.near_signature, action.candidate.url, self.config.dedup.min_similarity
        )
        if similar is None:
            return False
        action.exit_code = ExitCode.DUPLICATE_CONTENT
        action.duplicate_of, score = similar
        action.detail = f"near-duplicate: similarity {score:.2f}"
        return True

    def _crawl_sitemap(self, action: CrawlAction, resp: Response) -> None:
        """A sitemap or sitemap index: its <loc> entries go to the strategy like links."""
        parsed = sitemaps.parse_sitemap(resp.body)
        if parsed is None:
            return
        action.exit_code = ExitCode.OK
        kind = "sitemap index" if parsed.is_index else "sitemap"
        action.detail = f"{kind}: {len(parsed.locs)} URLs" + (" (truncated)" * parsed.truncated)
        depth = action.candidate.depth + 1
        meta = {"sitemap": True} if parsed.is_index else {"from_sitemap": True}
        found = []
        for loc in parsed.locs:
            target = normalize(loc, action.candidate.url, self.config.normalize)
            if target is not None and self.policy.in_scope(target):
                found.append(Request(target, depth, meta=dict(meta)))
        self._links(action, found, vetted=True)

    def _links(self, action: CrawlAction, links: list[Request], vetted: bool = False) -> None:
        """Pass links through the strategy; what it schedules in scope becomes candidates.

        vetted: the links are already normalized and in scope (not checked a second time).
        """
        request = self._request(action.candidate)
        kept = self.strategy.filter_extracted_links(request, links)
        self.strategy.refresh_states(kept)
        self.strategy.links_extracted(request, kept)
        action.links.extend(self._scheduled_links({r.url for r in links} if vetted else ()))

    def _scheduled_links(self, vetted: Collection[str] = ()) -> list[Link]:
        out = []
        for item in self.strategy.take_scheduled():
            url = item.request.url
            if url not in vetted:
                normalized = normalize(url, None, self.config.normalize)
                if normalized is None or not self.policy.in_scope(normalized):
                    continue
                url = normalized
            if not item.dont_queue:
                out.append(self._link(url, item.request.depth, item.score))
        return out

    def _link(self, url: str, depth: int, score: float) -> Link:
        """A scheduled URL as a link to record; its origin's crawler is reopened or added."""
        origin = origin_of(url)
        known = self.crawlers.get(origin)
        if known is not None:
            if known.finished and self.assignment is None:
                self._reopen(known)
        elif self.policy.origin_for(url) == origin:
            if self.assignment is not None:
                self.assignment.new_origin(origin)  # crawled by its partition's owner
            else:
                self.store.add_origins([origin])
                self._add_crawler(origin)
        return Link(url, origin, depth, score)

    def _record(self, crawler: OriginCrawler, action: CrawlAction) -> None:
        """Tell the strategy about errors, set the recrawl time, write it all in one transaction."""
        if action.exit_code not in COMPLETED and not action.retry:
            self.strategy.request_error(self._request(action.candidate), str(action.exit_code))
        if not action.links:
            action.links = self._scheduled_links()
        if not action.retry:
            action.next_due = next_due(
                action, action.candidate, self.config.recrawl, self.config.robots
            )
        self.store.record(action, self.run_id)
        self.strategy.domain_metadata.flush()
        self.stats.actions += 1
        self.stats.exit_codes[str(action.exit_code)] += 1
        self._stop_if_budget_spent()  # now, not when this origin's next turn comes

    async def _follow_assignment(self) -> None:
        """Distributed mode: crawl the origins our leases give us (docs/distributed.md)."""
        try:
            await self._follow_leases()
        except StoreError as exc:
            log.error("database error: %s", exc)
            self.stop(f"database error: {exc}")
        except Exception as exc:  # a bug: stop cleanly rather than wait forever
            self._stop_for_bug(exc)

    async def _follow_leases(self) -> None:
        fleet = self.assignment
        assert fleet is not None
        while not self._stop.is_set():
            finished = [c for c in self.crawlers.values() if c.finished]
            for crawler in finished:
                del self.crawlers[crawler.origin]  # added again if it gets work
            plan = fleet.poll(self.crawlers, finished, self.stats.actions, self._due_time())
            if plan.scope is not None and plan.scope != self.origins:  # seeds were added
                self.origins = plan.scope
                self.policy = Policy(self.config.policies, self.config.traps,
                                     [o + "/" for o in self.origins])
                self.stats.origins_total = len(self.origins)
            for origin in plan.origins:
                if origin not in self.crawlers:
                    self._add_crawler(origin)
                    crawler = self.crawlers[origin]  # the last owner's request may be recent
                    crawler.next_request_at = time.monotonic() + delay_for(
                        crawler, self.config.politeness
                    )
            if plan.done:
                self._fleet_done = True
                self._wake.set()
                return
            # poll again after the interval, or as soon as the last origin crawler finishes
            busy = bool(self.crawlers)
            end = time.monotonic() + (fleet.interval if busy else min(fleet.interval, 1.0))
            while time.monotonic() < end and not self._stop.is_set():
                if busy and all(c.finished for c in self.crawlers.values()):
                    break
                await asyncio.sleep(0.02)

    async def _housekeeping(self) -> None:
        """Commit the writes group commit held back, and report progress twice a second."""
        tick = max(0.02, min(0.5, self.config.commit_interval or 0.5))
        reported = 0.0
        while True:
            if self.on_progress is not None and time.monotonic() - reported >= 0.5:
                reported = time.monotonic()
                self.on_progress(self.stats)
            await asyncio.sleep(tick)
            try:
                self.store.flush(self.config.commit_interval)  # a group open that long
            except StoreError as exc:
                self.stop(f"database error: {exc}")
                return


def _internal_error(action: CrawlAction, exc: Exception) -> CrawlAction:
    """The crawl action of a response whose handling raised: what it had found is dropped."""
    log.warning("internal error on %s: %s", action.candidate.url, _describe(exc))
    log.debug("internal error", exc_info=exc)
    return CrawlAction(action.candidate, action.origin, ExitCode.INTERNAL_ERROR, action.started,
                       http_status=action.http_status, content_type=action.content_type,
                       content_length=action.content_length, detail=_describe(exc))


def _describe(exc: BaseException) -> str:
    """One line: the exception and the innermost place it was raised (-vv logs the traceback)."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    text = f"{type(exc).__name__}: {one_line(str(exc))}" if str(exc) else type(exc).__name__
    return text + where
