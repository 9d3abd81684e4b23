"""Every request through its origin's gate: one in flight per origin, none before its delay.

An origin's own turns already keep to that (the penalty box releases it once its time has come,
and never twice at once); the gate holds it for the requests another origin's turn makes to it:
a robots.txt that redirects to another origin's robots.txt, one hop after another. A request
waits while its target origin has one in flight and until that origin's next request time; once
answered, the origin's next request waits its delay. Origins the crawl does not know (a redirect
out of scope) are kept with the minimum delay, and forgotten once their time has passed. With a
politeness key, the origins of one key are one gate: their next request time is their KeyGate's
(scheduler.py), and one request is in flight for all of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from courtly.config import Politeness
from courtly.scheduler import OriginCrawler, delay_for

#: above this many origins the crawl does not know, those whose time has passed are dropped
_FOREIGN_KEPT = 4096


class Gate:
    """The requests in flight, by origin, and who waits for each."""

    def __init__(self, crawlers: Mapping[str, OriginCrawler], rules: Politeness) -> None:
        self._crawlers = crawlers
        self._rules = rules
        self._busy: dict[str, list[asyncio.Future[None]]] = {}  # gate key → waiters
        self._foreign: dict[str, float] = {}  # origin not crawled → its next request time

    def request(self, origin: str) -> Held:
        """Hold `origin` for one request (`async with`): wait for its turn, and start its delay
        when done."""
        return Held(self, origin)

    def _key(self, origin: str) -> str:
        """The origin's politeness key, once its gate is known (else the origin itself)."""
        crawler = self._crawlers.get(origin)
        return origin if crawler is None or crawler.gate is None else crawler.gate.key

    def _ready_at(self, origin: str) -> float:
        crawler = self._crawlers.get(origin)
        return crawler.next_request_at if crawler is not None else self._foreign.get(origin, 0.0)

    async def _enter(self, origin: str) -> str:
        """Wait until no request of the origin's key is in flight and its time has come."""
        while True:
            key = self._key(origin)
            waiters = self._busy.get(key)
            if waiters is not None:  # another request to it is in flight: wait for its end
                waiter = asyncio.get_running_loop().create_future()
                waiters.append(waiter)
                await waiter
                continue
            wait = self._ready_at(origin) - time.monotonic()
            if wait <= 0:
                self._busy[key] = []
                return key
            await asyncio.sleep(wait)

    def _leave(self, origin: str, key: str, answered: float) -> None:
        crawler = self._crawlers.get(origin)
        if crawler is not None:
            crawler.last_request = answered
            delay = delay_for(crawler, self._rules)
            crawler.next_request_at = max(crawler.next_request_at, answered + delay)
        else:
            if len(self._foreign) >= _FOREIGN_KEPT:
                self._foreign = {o: t for o, t in self._foreign.items() if t > answered}
            self._foreign[origin] = answered + self._rules.min_delay
        for waiter in self._busy.pop(key):
            if not waiter.done():
                waiter.set_result(None)


class Held:
    """One request held at its origin's gate, an async context manager (Gate.request): a class,
    not @asynccontextmanager, whose async generator cost 11,000 more instructions a request."""

    __slots__ = ("_gate", "_key", "_origin")

    def __init__(self, gate: Gate, origin: str) -> None:
        self._gate = gate
        self._origin = origin
        self._key = origin

    async def __aenter__(self) -> None:
        self._key = await self._gate._enter(self._origin)

    async def __aexit__(self, *exc: object) -> None:
        self._gate._leave(self._origin, self._key, time.monotonic())
