"""robots.txt per origin: the stored copy while it is fresh, else fetched hop by hop; RFC 9309's
status rules (4xx: allow all; 5xx, 429 or unreachable: a recent copy, else wait).

Each hop of a fetch is one request of the origin of its URL, made through the `Get` the crawl
loop gives: the loop decides how a request of that origin is sent (`RobotsChase` only says
which URL comes next). Parsing and matching are robots.py's; the store keeps the copy.

Neither stalls the event loop: a body over INLINE_PARSE bytes, or with as many wildcards as
MANY_WILDCARDS (numpy is imported then), is parsed in a thread (one parse for the origins that
serve it at once), and `judge` finds a URL's verdict in a thread when its match could take more
than INLINE_MATCH seconds (`RobotsRules.match_cost`: a hostile file's wildcard rules).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from courtly import clock
from courtly.config import CrawlConfig
from courtly.fetch import FetchError, HttpResponse
from courtly.model import Candidate, ExitCode
from courtly.outcome import REDIRECTS
from courtly.robots import MANY_WILDCARDS, RobotsRules, rules_for_status
from courtly.scheduler import (
    Ending,
    EndKind,
    OriginCrawler,
    backoff,
    backoff_jitter,
    delay_for,
    pause,
)
from courtly.store.database import Database
from courtly.urls import normalize, resolve

if TYPE_CHECKING:
    from courtly.policy import Policy
    from courtly.stats import CrawlStats

log = logging.getLogger("courtly")

#: distinct robots.txt files whose rules are kept for the origins that serve the same one
SHARED_RULES = 1024
#: bodies up to this size are parsed on the event loop (at most ~7 ms of CPU), bigger in a thread
INLINE_PARSE = 32 * 1024
#: matches estimated to take at most this many CPU seconds are made on the event loop
INLINE_MATCH = 1e-3

#: one request of robots.txt (or of a hop of its redirects) to the origin of the URL
Get = Callable[[str], Awaitable[HttpResponse]]


async def matching(rules: RobotsRules, url: str) -> RobotsRules:
    """The rules to judge url by: these, or when matching them could take more than
    INLINE_MATCH, their verdict found in a thread, as rules that answer every URL alike."""
    return rules if rules.match_cost(url) <= INLINE_MATCH else await asyncio.to_thread(
        rules.decided, url)


@dataclass(slots=True)
class RobotsChase:
    """One robots.txt fetch followed redirect by redirect (RFC 9309: at least five hops).

    `url` is the next request to make (None: done); `status` and `body` the last answer.
    """

    origin: str
    hops_left: int
    url: str | None = None
    status: int | None = None
    body: bytes = b""
    failure: str = ""  # why the last request failed
    own_address_blocked: bool = False  # the origin's own address is refused by the guard

    def __post_init__(self) -> None:
        self.url = self.origin + "/robots.txt"

    def answered(self, resp: HttpResponse) -> None:
        """A response: a redirect with a usable Location is the next hop, while hops are left."""
        assert self.url is not None
        self.status, self.body = resp.status, resp.body
        location = resp.headers.get("location")
        target = None
        if resp.status in REDIRECTS and location and self.hops_left > 0:
            target = normalize(location, self.url)
        self.hops_left -= 1
        self.url = target

    def failed(self, exc: FetchError) -> None:
        """No response: robots.txt is unreachable (or the origin itself may not be contacted).
        A 4xx whose body then failed is a 4xx: its status is what the rules read, not its body."""
        assert self.url is not None
        if exc.status is not None and 400 <= exc.status < 500 and exc.status != 429:
            self.status, self.body, self.url = exc.status, b"", None
            return
        self.failure, self.status = exc.detail, None
        self.own_address_blocked = (
            exc.exit_code is ExitCode.BLOCKED_ADDRESS and self.url.startswith(self.origin)
        )
        self.url = None


class RobotsCache:
    """Keeps each origin crawler's robots.txt rules current (crawler.robots, robots_expires)."""

    def __init__(self, config: CrawlConfig, db: Database, stats: CrawlStats) -> None:
        self.config = config
        self.rules = config.robots
        self.db = db
        self.stats = stats
        #: (status, body) → its rules, least recently used first (many sites share one file)
        self._known: OrderedDict[tuple[int, bytes], tuple[bytes, RobotsRules]] = OrderedDict()
        #: the bodies being parsed in a thread
        self._parsing: dict[tuple[int, bytes], asyncio.Future[RobotsRules]] = {}

    def due(self, crawler: OriginCrawler) -> bool:
        """robots.txt is obeyed and there is none yet, or it expired."""
        return self.rules.obey and (
            crawler.robots is None or time.monotonic() >= crawler.robots_expires
        )

    async def load_stored(self, crawler: OriginCrawler) -> bool:
        """Use the stored robots.txt if it has not expired (a resumed or repeated crawl)."""
        state = crawler.state
        if crawler.robots is not None or state.robots_fetched is None:
            return False
        age = clock.now() - state.robots_fetched
        if state.robots_status is None or age >= self.rules.expiry:
            return False
        crawler.robots = await self._parse(state.robots_status, state.robots_body or b"")
        crawler.robots_expires = time.monotonic() + self.rules.expiry - age
        self._clamped(crawler)
        return True

    async def fetch(self, crawler: OriginCrawler, get: Get) -> None:
        """Fetch /robots.txt hop by hop and apply the status rules; the origin's delay runs."""
        chase = RobotsChase(crawler.origin, self.rules.max_redirects)
        while chase.url is not None:
            try:
                chase.answered(await get(chase.url))
            except FetchError as exc:
                log.info("%s: robots.txt unreachable: %s", crawler.origin, exc.detail)
                chase.failed(exc)
        if chase.own_address_blocked:
            # never contacted, so no robots.txt applies: each URL is then logged
            # BLOCKED_ADDRESS by the address guard, without a request
            crawler.robots = await self._parse(404, b"")
            crawler.robots_expires = time.monotonic() + self.rules.expiry
            return
        await self._apply(crawler, chase.status, chase.body, chase.failure)
        crawler.next_request_at = max(
            crawler.next_request_at,
            time.monotonic() + delay_for(crawler, self.config.politeness),
        )

    async def judge(
        self, crawler: OriginCrawler, candidate: Candidate, policy: Policy
    ) -> RobotsRules | None:
        """The rules to judge a candidate by: the origin's, or when matching them could take more
        than INLINE_MATCH (and the policies let the URL through), their verdict found in a
        thread, as rules that answer every URL alike."""
        rules, url = crawler.robots, candidate.url
        if rules is None or rules.match_cost(url) <= INLINE_MATCH \
                or not policy.check(url, candidate.depth).allowed:
            return rules
        return await asyncio.to_thread(rules.decided, url)

    async def _parse(self, status: int, body: bytes) -> RobotsRules:
        return (await self._shared(status, body))[1]

    async def _shared(self, status: int, body: bytes) -> tuple[bytes, RobotsRules]:
        """A file and its rules, one copy for the origins whose file is the same (the rules are
        immutable); a big body is parsed in a thread."""
        key = (status, body)
        known = self._known.get(key)
        if known is not None:
            self._known.move_to_end(key)
            return known
        if len(body) <= INLINE_PARSE and body.count(b"*") < MANY_WILDCARDS:  # no numpy
            rules = self._rules_for(status, body)
        else:
            parsing = self._parsing.get(key)
            if parsing is None:
                parsing = asyncio.ensure_future(asyncio.to_thread(self._rules_for, status, body))
                self._parsing[key] = parsing
                parsing.add_done_callback(lambda _: self._parsing.pop(key, None))
            rules = await asyncio.shield(parsing)
            known = self._known.get(key)
            if known is not None:  # another origin's turn stored it first
                return known
        if len(self._known) >= SHARED_RULES:
            self._known.popitem(last=False)  # the least recently used
        self._known[key] = known = body, rules
        return known

    def _rules_for(self, status: int, body: bytes) -> RobotsRules:
        return rules_for_status(status, body, self.config.user_agent, self.rules.max_size)

    async def _apply(
        self, crawler: OriginCrawler, status: int | None, body: bytes, failure: str
    ) -> None:
        """RFC 9309 status rules: 5xx/429/unreachable (failure says why) → stale copy or wait;
        else parse."""
        rules = self.rules
        state = crawler.state
        if status is None or status == 429 or status >= 500:
            state.robots_error = failure or f"status {status}"  # kept for `courtly check`
            stale = state.robots_fetched is not None and state.robots_status is not None and (
                clock.now() - state.robots_fetched < rules.stale_cache_limit
            ) and state.robots_status < 500
            if stale and state.robots_status is not None:
                crawler.robots = await self._parse(state.robots_status, state.robots_body or b"")
                crawler.robots_expires = time.monotonic() + min(rules.expiry, 60.0)
                self._clamped(crawler)
            else:
                crawler.robots = None  # unavailable: nothing is crawled until it recovers
                crawler.patience -= 1
                crawler.ending = Ending(EndKind.ROBOTS_UNAVAILABLE,
                                        f"robots.txt unavailable ({state.robots_error})")
                now = time.monotonic()
                level, seconds = backoff(crawler, None, self.config.politeness, now,
                                         backoff_jitter())
                pause(crawler, level, seconds, now)
            self.db.save_origin(state)
            return
        body, crawler.robots = await self._shared(status, body)
        crawler.ending = None
        state.robots_status, state.robots_body, state.robots_error = status, body, None
        state.robots_fetched = clock.now()
        state.crawl_delay = crawler.robots.crawl_delay
        # not before the origin's next turn: an expiry shorter than its delay would have every
        # turn fetch robots.txt again, and no page ever
        crawler.robots_expires = time.monotonic() + max(
            rules.expiry, 2 * delay_for(crawler, self.config.politeness))
        state.sitemaps = sitemap_urls(crawler.robots.sitemaps, crawler.origin)
        self.db.save_origin(state)
        self._clamped(crawler)

    def _clamped(self, crawler: OriginCrawler) -> None:
        """A Crawl-delay above the cap, obeyed at the cap, is named in the crawl's last lines."""
        asked = crawler.robots.crawl_delay if crawler.robots is not None else None
        politeness = self.config.politeness
        if asked is not None and asked > politeness.max_crawl_delay and (
                politeness.crawl_delay_above_cap == "clamp"):
            self.stats.clamped[crawler.origin] = asked
            self.stats.clamped_to = politeness.max_crawl_delay


def sitemap_urls(lines: list[str], origin: str) -> list[str]:
    """robots.txt's Sitemap values as URLs: a relative one resolved against the robots.txt URL (as
    crawler-commons does), one that is no http(s) URL dropped, repeats once."""
    robots_url = origin + "/robots.txt"
    return list(dict.fromkeys(url for line in lines if (url := resolve(line, robots_url))))
