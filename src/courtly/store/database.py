"""The crawl database as the crawl loop uses it: reads are awaited, writes are queued.

On SQLite every call runs at once (in-process, microseconds; group commit batches the writes). On
PostgreSQL a DatabaseThread (thread.py) runs them, so the event loop never waits on the server:
reads are awaited, writes are queued and sent in batches, each fenced by the lease of the
partition it is for (`fence(origin)`, given by the fleet; docs/distributed.md).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from courtly.model import Candidate, CrawlAction, Link, LinkState, OriginState
from courtly.store.base import Store, StoreError, Write

if TYPE_CHECKING:
    from courtly.steering import Fleet
    from courtly.store.thread import DatabaseThread

T = TypeVar("T")
#: the lease a write for an origin is made under: (partition, epoch), or None (not fenced)
Fence = Callable[[str], "tuple[int, int] | None"]


def _unfenced(origin: str) -> None:
    return None


class Database:
    """A Store for an event loop (see the module's docstring)."""

    def __init__(
        self,
        store: Store,
        window: float = 0.0,
        fleet: Fleet | None = None,
    ) -> None:
        self.store = store
        #: the lease each write is made under: the fleet's, or none (one crawl alone)
        self.fence: Fence = fleet.lease if fleet is not None else _unfenced
        self.thread: DatabaseThread | None = None
        if store.shared:  # PostgreSQL (imported only then: psycopg is slow to import)
            from courtly.store.postgres import PostgresStore
            from courtly.store.thread import DatabaseThread

            assert isinstance(store, PostgresStore)
            refused = fleet.refused if fleet is not None else None
            self.thread = DatabaseThread(store, refused, window=window)
        #: on PostgreSQL: the origins whose last crawl action is not committed yet, and when it
        #: will be
        self._unwritten: dict[str, asyncio.Future[None]] = {}

    def stop_on_failure(self, stop: Callable[[StoreError], None]) -> None:
        """The database thread gave up (the server stayed away past the limit): `stop` hears
        of it on the running event loop."""
        if self.thread is not None:
            loop = asyncio.get_running_loop()

            def failed(exc: StoreError) -> None:  # on the database thread
                loop.call_soon_threadsafe(stop, exc)

            self.thread.on_failure = failed

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args), a function of the store: on the database thread if there is one."""
        if self.thread is None:
            return fn(*args)
        return await self.thread.call(fn, *args)

    def later(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """fn(*args) after every write queued so far (at once on SQLite); its future."""
        if self.thread is not None:
            return self.thread.later(fn, *args)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def wait(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args), blocking the caller (start-up, a strategy's own reads)."""
        return fn(*args) if self.thread is None else self.thread.wait(fn, *args)

    # -- reads ---------------------------------------------------------------------------
    async def take_todo(self, origin: str, run: int, limit: int, now: float) -> list[Candidate]:
        """Store.take_todo."""
        return await self.call(self.store.take_todo, origin, run, limit, now)

    async def load_origin(self, origin: str) -> OriginState:
        """Store.load_origin."""
        return await self.call(self.store.load_origin, origin)

    async def page_lookups(
        self, content_hash: str | None, signature: bytes | None, url: str,
        min_similarity: float, links: list[str] | None, score: float, own: int | None = None,
    ) -> tuple[str | None, tuple[str, float] | None, list[str] | None, float | None]:
        """SqlStore.page_lookups."""
        return await self.call(self.store.page_lookups, content_hash, signature, url,
                               min_similarity, links, score, own)

    async def redirect_chain(self, url: str, limit: int) -> int:
        """Store.redirect_chain."""
        return await self.call(self.store.redirect_chain, url, limit)

    async def candidate(self, url: str) -> dict[str, Any] | None:
        """Store.candidate."""
        return await self.call(self.store.candidate, url)

    # -- writes --------------------------------------------------------------------------
    async def record(self, action: CrawlAction, run: int) -> None:
        """Store.record; on PostgreSQL queued under the lease of the action's origin, not
        awaited: the origin's next turn goes on while it is written. Its next crawl action's
        record waits for it, so that an origin has at most one action written and not yet
        committed (besides one being read beside its next request, and that request: crawler.py);
        the loop goes on with the other origins meanwhile."""
        if self.thread is None:
            self.store.record(action, run)
            return
        origin = action.origin
        previous = self._unwritten.get(origin)
        if previous is not None and not previous.done():
            await previous
        if action.origin_state is not None:
            action.origin_state = _snapshot(action.origin_state)
        self.thread.write(Write(action, run, self.fence(origin)))
        written = self._unwritten[origin] = self.thread.committed()
        written.add_done_callback(functools.partial(self._written, origin))

    def _written(self, origin: str, done: asyncio.Future[None]) -> None:
        """An origin's last crawl action is committed (or refused, or the database is gone for
        good: the error is the next flush's)."""
        if self._unwritten.get(origin) is done:
            del self._unwritten[origin]
        if not done.cancelled():
            done.exception()  # retrieved: flush raises it

    async def written(self, origin: str) -> None:
        """Wait until the origin's last crawl action is committed (at once on SQLite; its
        error, if any, is the next flush's)."""
        pending = self._unwritten.get(origin)
        if pending is not None and not pending.done():
            await asyncio.wait((pending,))

    def unwritten(self) -> list[str]:
        """The origins whose last crawl action is not committed yet (a fleet hands a partition
        back only once it has none)."""
        return list(self._unwritten)

    def save_origin(self, state: OriginState) -> None:
        """Store.save_origin; queued on PostgreSQL, under the lease of the origin."""
        if self.thread is None:
            self.store.save_origin(state)
        else:
            self.thread.write(Write(lease=self.fence(state.origin), state=_snapshot(state)))

    def add_links(self, origin: str, links: list[Link]) -> None:
        """Store.add_links, for links found while crawling `origin` (under its lease)."""
        if not links:
            return
        if self.thread is None:
            self.store.add_links(links)
        else:
            self.thread.write(Write(lease=self.fence(origin), links=links))

    def add_origins(self, origins: list[str]) -> None:
        """Store.add_origins (not fenced: a configured origin is the whole fleet's)."""
        if self.thread is None:
            self.store.add_origins(origins)
        else:
            self.thread.write(Write(origins=origins))

    def flush_group(self, age: float) -> None:
        """SQLite's group commit: commit writes held back at least `age` seconds."""
        if self.thread is None:
            self.store.flush(age)

    async def flush(self) -> None:
        """Every write so far committed."""
        if self.thread is None:
            self.store.flush()
        else:
            await self.thread.flush()

    def close(self) -> None:
        """Stop the database thread (after what is queued); the store stays open."""
        if self.thread is not None:
            self.thread.close()


def _snapshot(state: OriginState) -> OriginState:
    """A copy of an origin's state for the database thread (the loop goes on changing it)."""
    return dataclasses.replace(state, sitemaps=list(state.sitemaps),
                               metadata=copy.deepcopy(state.metadata))


class StrategyStore:
    """What a crawling strategy reads and writes (strategy.StoreContext), synchronously: its reads
    of what the seen cache does not know wait for the database thread (the loop with them: the
    metadata of an origin not crawled here, once; states of URLs not on the page), its writes
    are queued."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def states(self, urls: list[str]) -> dict[str, LinkState]:
        """Store.states: on PostgreSQL from the seen cache when it knows every URL (the links of
        the page being handled were read with its look-ups), without waiting for the thread."""
        if self.db.thread is not None:
            known, missing = self.db.thread.store.seen.known(dict.fromkeys(urls))
            if not missing:
                return known
        return self.db.wait(self.db.store.states, urls)

    def load_origin(self, origin: str) -> OriginState:
        """Store.load_origin."""
        return self.db.wait(self.db.store.load_origin, origin)

    def save_origin(self, state: OriginState) -> None:
        """Store.save_origin (queued)."""
        self.db.save_origin(state)
