"""Which origins a crawl crawls, and who says so: the crawl alone (its configured origins and
those its links find in scope) or its fleet (distributed mode: the origins its leases give).

The crawl loop (crawler.py) asks `Steering` whether an origin is still its own before each turn
and each request, and hands it each origin a link names (`admit`). A fleet (`Fleet`, implemented
by distributed.Worker; the loop never imports it) follows the crawl through the same object: the
origin crawlers and their turns, a new scope when seeds are added (`rescope`), the origins its
leases give (`take_over`), the end of its work (`finish`). docs/distributed.md.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from typing import Any, Protocol

from courtly import clock
from courtly.config import CrawlConfig
from courtly.model import OriginState
from courtly.policy import Policy, ShapeBudget
from courtly.scheduler import OriginCrawler, Turns, delay_for
from courtly.stats import CrawlStats, Stop, StopKind
from courtly.store.base import Store, Write
from courtly.store.database import Database
from courtly.urls import bare_host


class Fleet(Protocol):
    """The fleet as the crawl knows it (distributed.Worker); `follow` drives `Steering`.

    `join` runs on the database thread; `lease` gives the (partition, epoch) a write for an
    origin is fenced with; `refused` hears of writes the database refused (a lease was lost).
    """

    def join(self) -> int: ...
    def owns(self, origin: str) -> bool: ...
    def lease(self, origin: str) -> tuple[int, int] | None: ...
    def refused(self, writes: list[Write]) -> None: ...
    def new_origin(self, origin: str) -> None: ...
    async def follow(self, crawl: Steering) -> None: ...


class Steering:
    """The crawl's origin crawlers: whose origins they are, and what a fleet changes of them."""

    def __init__(
        self, config: CrawlConfig, store: Store, db: Database, turns: Turns, stats: CrawlStats,
        fleet: Fleet | None,
    ) -> None:
        self.config = config
        self.store = store
        self.db = db
        self.turns = turns
        self.stats = stats
        self.fleet = fleet
        self.origins = store.configured_origins()
        #: the seeds' hosts, which the address guard lets through: the fetcher reads this set
        #: as it grows (seeds a fleet adds while it crawls, `rescope`)
        self.seed_hosts = _hosts(store.seed_origins())
        self.policy = Policy(config.policies, config.traps, [o + "/" for o in self.origins])
        self.done = False  # the fleet has no work left

    # -- what the crawl loop asks ----------------------------------------------------------
    async def begin(self) -> int:
        """The run this crawl records its actions in (a fleet's: joined on the database
        thread), and the first origin crawlers: the configured origins (a fleet's: `follow`)."""
        fleet = self.fleet
        run = await self.db.call(self.store.begin_run if fleet is None else fleet.join)
        if self.config.force_recrawl:  # kept: a resume without the flag recrawls what is left
            await self.db.call(self.store.make_due, run, clock.now())
        if fleet is not None:
            return run
        for origin in self.origins:
            self.add(origin, await self.db.load_origin(origin))
        return run

    async def end(self, run: int, stop: Stop) -> None:
        """Every request of this process ended: record when each origin was last asked (a
        resume waits only what is left of its delay), and a finished run. A failed crawl
        records nothing (its resume waits every origin's whole delay); a fleet, its end."""
        finished = stop.kind is StopKind.FINISHED
        if stop.failed or (self.fleet is not None and not finished):
            return
        wall, now = clock.now(), time.monotonic()
        last = {} if self.fleet is not None else {
            c.origin: wall - (now - c.last_request)
            for c in self.turns.crawlers.values() if c.last_request}
        await self.db.call(self.store.end_run, run, last, finished)

    def jobs(self) -> list[Coroutine[Any, Any, None]]:
        """What runs beside the turns: the fleet's `follow`."""
        return [] if self.fleet is None else [self.fleet.follow(self)]

    def more(self) -> bool:
        """Whether the crawl waits for more work when no origin has any (a fleet's may come)."""
        return self.fleet is not None and not self.done

    def owns(self, origin: str) -> bool:
        """In a fleet: our lease on the origin's partition still holds (else its turn ends: the
        partition is being handed over, or the lease is in doubt)."""
        return self.fleet is None or self.fleet.owns(origin)

    def due_time(self) -> float:
        """Candidates due before this wall-clock time are taken (all with --force-recrawl)."""
        return float("inf") if self.config.force_recrawl else clock.now()

    def admit(self, url: str, origin: str) -> None:
        """A link to `origin`: a finished crawler is reopened, a new origin in scope added (in a
        fleet, for its partition's owner)."""
        known = self.turns.crawlers.get(origin)
        if known is not None:
            if known.finished and self.fleet is None:
                self.turns.reopen(known)
        elif self.policy.origin_for(url) == origin:
            if self.fleet is not None:
                self.fleet.new_origin(origin)
            else:
                self.db.add_origins([origin])
                self.add(origin, self.db.wait(self.store.load_origin, origin))

    def add(self, origin: str, state: OriginState, taken_over: bool = False) -> None:
        """An origin crawler for `origin`, its first turn once its backoff is over."""
        traps, rules = self.config.traps, self.config.politeness
        crawler = OriginCrawler(origin, state, patience=rules.patience, shapes=ShapeBudget(
            traps.max_actions_per_shape, traps.shape_depth_slack, traps.max_query_recombinations))
        # from another worker (its last request may be now), or from an earlier process of
        # this crawl (a clean stop stored it; after kill -9, the resume's start: `begin_run`)
        last = clock.now() if taken_over else state.last_request
        if last is not None:
            wait = last + delay_for(crawler, rules) - clock.now()
            crawler.next_request_at = time.monotonic() + max(0.0, wait)
        self.turns.add(crawler, time.monotonic() + max(0.0, state.backoff_until - clock.now()))

    # -- what the fleet does (Fleet.follow) ------------------------------------------------
    def rescope(self, origins: list[str], seeds: list[str]) -> None:
        """The configured origins changed (seeds were added): the scope and the address guard
        follow (before, a private-address seed added while a worker ran was BLOCKED_ADDRESS)."""
        self.seed_hosts |= _hosts(seeds)  # in place: the fetcher's own set
        if origins != self.origins:
            self.origins = origins
            self.policy.rescope([o + "/" for o in origins])

    async def take_over(self, origin: str) -> None:
        """An origin of our leases with work: crawl it (the last owner's request may be recent)."""
        if origin not in self.turns.crawlers:
            self.add(origin, await self.db.load_origin(origin), taken_over=True)

    def finish(self) -> None:
        """The fleet has no work left: the crawl ends when its turns do."""
        self.done = True
        self.turns.wake()


def _hosts(origins: list[str]) -> set[str]:
    """Origins' hosts as the fetcher's address guard compares them."""
    return {bare_host(origin + "/") for origin in origins}
