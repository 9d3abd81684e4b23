"""The connection pool: at most `limit` open sockets, idle connections kept per endpoint and
closed least recently used first, the bound sized from the process's file-descriptor limit.

Every socket courtly opens for a fetch (a connection in use, an idle one, an attempt still
connecting) holds a Slot; a fetch that finds the pool full closes the least recently used idle
connection and waits, in order of arrival, for a slot to be given back. So a crawl of any number
of origins never runs out of file descriptors on its own account.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Generic, Protocol, TypeVar

from courtly.config import FD_RESERVE, MAX_AUTO_CONNECTIONS

try:
    import resource
except ImportError:  # pragma: no cover - not on Windows
    resource = None  # type: ignore[assignment]

__all__ = ["Pool", "Slot", "connection_limit"]

K = TypeVar("K")


class Idle(Protocol):
    """What the pool needs of a connection it keeps idle (connection.Connection)."""

    closed: bool
    idle_since: float
    idle_until: float
    server_keep_alive: float | None

    def close(self) -> None: ...


C = TypeVar("C", bound=Idle)


def connection_limit(configured: int) -> int:
    """The bound on open connections: the configured one, or (0) what RLIMIT_NOFILE leaves once
    FD_RESERVE and an eighth of the limit are set aside, at least 1."""
    if configured:
        return configured
    soft = MAX_AUTO_CONNECTIONS * 2
    if resource is not None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            soft = MAX_AUTO_CONNECTIONS * 2
    return max(1, min(MAX_AUTO_CONNECTIONS, soft - max(FD_RESERVE, soft // 8)))


class Slot:
    """The permit for one open socket; given back once (by the connection when it closes, or by
    the attempt that failed to connect)."""

    __slots__ = ("_pool", "held", "owned")

    def __init__(self, pool: Pool[Any, Any]) -> None:
        self._pool = pool
        self.held = True
        self.owned = False  # a connection was made: its connection_lost gives the slot back

    def release(self) -> None:
        """Give the slot back (a second call does nothing)."""
        if self.held:
            self.held = False
            self._pool._give_back()


class Pool(Generic[K, C]):
    """Slots for at most `limit` sockets, and the idle connections by endpoint in LRU order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int, keep_alive: float,
                 per_endpoint: int) -> None:
        self._loop = loop
        self.limit = limit
        self.ceiling = limit  # the bound it started with (shrink lowers limit, grow restores it)
        self.keep_alive = keep_alive
        self._per_endpoint = per_endpoint
        self.open = 0  # slots held
        self._waiters: collections.deque[asyncio.Future[Slot]] = collections.deque()
        self._idle: dict[K, list[C]] = {}
        self._lru: collections.OrderedDict[C, K] = collections.OrderedDict()
        self._timer: asyncio.TimerHandle | None = None

    # -- slots (while someone waits, every slot is taken: a given-back one is handed over) -----
    async def slot(self) -> Slot:
        """A slot: free now, or once the least recently used idle connection is closed, or
        once a connection in use is done (first come, first served)."""
        if self.open < self.limit and not self._waiters:
            self.open += 1
            return Slot(self)
        waiter: asyncio.Future[Slot] = self._loop.create_future()
        self._waiters.append(waiter)
        self._evict(1)  # its slot comes back when the socket is closed
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                waiter.result().release()  # handed over just as we were cancelled
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def _give_back(self) -> None:
        if self.open <= self.limit:
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_result(Slot(self))
                    return
        self.open -= 1

    def shrink(self) -> None:
        """Out of descriptors under our bound: keep the bound at the sockets open now (at least
        1), so the process stays under its real limit, and close every idle connection."""
        self.limit = max(1, min(self.limit, self.open))
        self._evict(len(self._lru))

    def grow(self) -> None:
        """One more socket allowed again after a shrink, up to the bound the pool started with."""
        if self.limit < self.ceiling:
            self.limit += 1
            while self.open < self.limit and self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    self.open += 1
                    waiter.set_result(Slot(self))

    # -- idle connections ------------------------------------------------------------------
    def take(self, key: K) -> C | None:
        """The most recently used idle connection to `key` still open and in time, or None."""
        idle = self._idle.get(key)
        now = self._loop.time()
        while idle:
            conn = idle.pop()
            del self._lru[conn]
            if not conn.closed and now < conn.idle_until:
                if not idle:
                    del self._idle[key]
                return conn
            conn.close()
        self._idle.pop(key, None)
        return None

    def put(self, key: K, conn: C) -> None:
        """Keep a connection whose response ended cleanly, until the earlier of keep_alive and a
        second before the server's Keep-Alive timeout; close it if someone waits for a slot."""
        now = self._loop.time()
        keep = self.keep_alive
        if conn.server_keep_alive is not None:
            keep = min(keep, conn.server_keep_alive - 1.0)
        idle = self._idle.setdefault(key, [])
        if (conn.closed or keep <= 0 or self._waiters or len(idle) >= self._per_endpoint):
            if not idle:
                del self._idle[key]
            conn.close()
            return
        conn.idle_since, conn.idle_until = now, now + keep
        idle.append(conn)
        self._lru[conn] = key
        if self._timer is None:
            self._timer = self._loop.call_at(now + self.keep_alive, self._sweep)

    def idle_count(self) -> int:
        """Idle connections kept (some may have been closed by their server meanwhile)."""
        return len(self._lru)

    def _evict(self, count: int) -> None:
        """Close up to `count` idle connections still open, least recently used first."""
        while count > 0 and self._lru:
            conn, key = self._lru.popitem(last=False)
            self._drop(key, conn)
            if not conn.closed:
                conn.close()
                count -= 1

    def _drop(self, key: K, conn: C) -> None:
        idle = self._idle[key]
        idle.remove(conn)
        if not idle:
            del self._idle[key]

    def _sweep(self) -> None:
        """Close the connections idle for keep_alive seconds (the oldest are first)."""
        self._timer = None
        now = self._loop.time()
        while self._lru:
            conn, key = next(iter(self._lru.items()))
            if not conn.closed and now < conn.idle_since + self.keep_alive:
                self._timer = self._loop.call_at(conn.idle_since + self.keep_alive, self._sweep)
                return
            del self._lru[conn]
            self._drop(key, conn)
            conn.close()

    def close(self) -> None:
        """Close every idle connection (those in use are closed by their fetch)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._evict(len(self._lru))
        for waiter in self._waiters:
            waiter.cancel()
        self._waiters.clear()
