"""The DNS cache: each host resolved once at a time, its answer kept for a while, in bounded room.

Requests to many origins of one host (ports, or later a whole shared-hosting server) ask for its
addresses together: they share one lookup. Answers are kept `ttl` seconds (`limits.dns_ttl`) for
at most `size` hosts (`limits.dns_cache_size`), the least recently used forgotten first; failures
are not kept. The lookups themselves run off the event loop, in the resolver (getaddrinfo in a
thread), several at once.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable

__all__ = ["Addresses", "DnsCache"]

#: a resolver's answer: the (address, address family) pairs to connect to, in order
Addresses = list[tuple[str, int]]
#: what resolves a name: host, port -> addresses (OSError when it has none)
Lookup = Callable[[str, int], Awaitable[Addresses]]


class DnsCache:
    """Resolved addresses by host name, shared, expiring and bounded."""

    def __init__(self, size: int, ttl: float, clock: Callable[[], float]) -> None:
        self.size = size
        self.ttl = ttl
        self._clock = clock
        self._answers: collections.OrderedDict[str, tuple[float, Addresses]] = (
            collections.OrderedDict())
        self._pending: dict[str, asyncio.Future[Addresses]] = {}
        self.lookups = 0  # names sent to the resolver

    async def resolve(self, host: str, port: int, lookup: Lookup) -> Addresses:
        """The addresses of host: kept ones, the lookup under way, or a new lookup."""
        known = self._answers.get(host)
        if known is not None:
            if known[0] > self._clock():
                self._answers.move_to_end(host)
                return known[1]
            del self._answers[host]
        pending = self._pending.get(host)
        if pending is None:
            pending = self._pending[host] = asyncio.ensure_future(self._lookup(host, port, lookup))
            pending.add_done_callback(_retrieved)
        return await asyncio.shield(pending)  # one asker cancelled: the others still get it

    async def _lookup(self, host: str, port: int, lookup: Lookup) -> Addresses:
        self.lookups += 1
        try:
            addresses = await lookup(host, port)
        finally:
            del self._pending[host]
        self._answers[host] = (self._clock() + self.ttl, addresses)
        while len(self._answers) > self.size:
            self._answers.popitem(last=False)
        return addresses

    def address(self, host: str) -> str | None:
        """The first address host resolved to, if kept (what politeness by IP would group by)."""
        known = self._answers.get(host)
        return None if known is None or not known[1] else known[1][0][0]

    def __len__(self) -> int:
        return len(self._answers)


def _retrieved(future: asyncio.Future[Addresses]) -> None:
    """A lookup whose askers all gave up: its error is not 'never retrieved'."""
    if not future.cancelled():
        future.exception()
