"""The database thread: PostgreSQL's work off the event loop (docs/distributed.md).

One thread owns the PostgreSQL connection. The event loop hands it calls (reads, the fleet's
heartbeat) and awaits them without blocking, and queues writes without waiting at all. Each time
the thread wakes it takes everything queued: the writes first, all in one transaction sent in one
round trip (`PostgresStore.write_batch`, fenced by their leases), then the calls, in order (so a
read sees every write queued before it). Once the loop is busy (a wake took BUSY jobs or more),
each wake first waits `window` (`[fleet] batch_window`) for more work to go with it: fewer,
larger batches cost the worker and the server less CPU a page, and a crawl that busy loses
nothing by a few milliseconds more a round trip. A quiet loop's calls go at once, as does a
call that blocks its caller (`wait`: a strategy's own read, on the loop). A connection
lost on the way is reconnected here, with backoff, for up to the store's retry limit, and the
work is sent again; past the limit every waiting call, and `on_failure`, get the one-line error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar

from courtly.errors import describe
from courtly.store.base import ConnectionLost, StoreError, Write
from courtly.store.postgres import PostgresStore

log = logging.getLogger("courtly")

T = TypeVar("T")
#: a wake that took this many jobs or more: the loop is busy, and the next wake gathers
BUSY = 16


@dataclass(slots=True)
class _Call:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    loop: asyncio.AbstractEventLoop | None  # None: a thread waits on a concurrent future
    future: asyncio.Future[Any] | concurrent.futures.Future[Any]


def _nothing() -> None:
    return None


class DatabaseThread:
    """The thread that runs a PostgresStore for an event loop."""

    def __init__(
        self,
        store: PostgresStore,
        on_refused: Callable[[list[Write]], None] | None = None,
        on_failure: Callable[[StoreError], None] | None = None,
        window: float = 0.0,
    ) -> None:
        self.store = store
        self.window = window  # after a busy wake, the next one waits this long for more work
        self.on_refused = on_refused  # writes the database refused (a lease was lost): thread
        self.on_failure = on_failure  # the database is gone for good: called in the thread
        self.failed: StoreError | None = None
        self._reads = (store.take_todo, store.load_origin, store.redirect_chain,
                       store.candidate)
        self._jobs: deque[_Call | Write] = deque()
        self._ready = threading.Condition()
        self._closing = False
        self._busy = False  # the last wake took BUSY jobs or more
        self._blocked = False  # a caller blocks until its call is answered (`wait`)
        self._thread = threading.Thread(target=self._main, name="courtly-database", daemon=True)
        self._thread.start()

    # -- what the event loop calls -----------------------------------------------------------
    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) on the database thread; the loop awaits the result."""
        return await self.later(fn, *args)

    def later(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue fn(*args) now (after the writes queued so far); the future of its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._put(_Call(fn, args, loop, future))
        return future

    def wait(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) on the database thread and block until it is done (synchronous callers:
        start-up, a strategy's own reads)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._put(_Call(fn, args, None, future))
        return future.result()

    def write(self, write: Write) -> None:
        """Queue a write; it is sent with the others queued by the time the thread wakes."""
        if self.failed is not None:
            raise self.failed
        self._put(write)

    def committed(self) -> asyncio.Future[None]:
        """A future settled once every write queued so far is committed (or refused)."""
        return self.later(_nothing)

    async def flush(self) -> None:
        """Wait until every write queued so far is committed (or refused)."""
        await self.committed()

    def close(self) -> None:
        """Finish what is queued, then stop the thread (the store stays open)."""
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._thread.join()

    def _put(self, job: _Call | Write) -> None:
        with self._ready:
            if self._closing:
                raise StoreError(f"the database thread of {self.store.path} is closed")
            self._jobs.append(job)
            blocking = isinstance(job, _Call) and job.loop is None
            self._blocked |= blocking
            if blocking or len(self._jobs) == 1:  # else the thread is awake, or gathering
                self._ready.notify()

    # -- the thread --------------------------------------------------------------------------
    def _main(self) -> None:
        while True:
            with self._ready:
                while not self._jobs and not self._closing:
                    self._ready.wait()
                if self._busy and self.window:
                    self._gather()
                if not self._jobs:
                    return
                jobs = list(self._jobs)
                self._jobs.clear()
                self._blocked = False
            self._busy = len(jobs) >= BUSY
            writes = [j for j in jobs if isinstance(j, Write)]
            if writes and self.failed is None:
                try:
                    refused = self._write(writes)
                except StoreError as exc:
                    self._fail(exc)
                except Exception as exc:  # a bug: stop the crawl rather than wait forever
                    self._fail(StoreError(f"internal error writing to {self.store.path}: "
                                          f"{describe(exc)}"))
                else:
                    if refused and self.on_refused is not None:
                        self.on_refused(refused)
            settled: dict[asyncio.AbstractEventLoop, list[tuple[Any, Any, Any]]] = {}
            lookups: list[_Call] = []  # the wake's page look-ups: sent together
            for job in jobs:
                if not isinstance(job, _Call):
                    continue
                if job.loop and job.fn == self.store.page_lookups:
                    lookups.append(job)
                    continue
                if not self._reads_only(job):  # the look-ups queued before it see it not
                    self._run_lookups(lookups, settled)
                self._run(job, settled)
            self._run_lookups(lookups, settled)
            for loop, items in settled.items():  # one wake-up of each loop per batch
                with suppress(RuntimeError):  # that loop is closed: nobody waits any more
                    loop.call_soon_threadsafe(_settle_all, items)

    def _gather(self) -> None:
        """(The lock held.) Wait up to the window for more work to go with what is queued;
        a caller blocked until its answer (the event loop itself, maybe) ends the wait, as does
        closing."""
        deadline = time.monotonic() + self.window
        while not (self._blocked or self._closing):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._ready.wait(left)

    def _reads_only(self, call: _Call) -> bool:
        """A call that writes nothing a page's look-up reads: the look-ups queued before it may
        wait for it, and go with those queued after (one round trip a wake: each was ~0.7 ms
        on a busy 2-core machine, where the database thread's round trips bound one worker;
        bench/RESULTS.md)."""
        return call.fn is _nothing or call.fn in self._reads

    def _write(self, writes: list[Write]) -> list[Write]:
        """write_batch, sent again after a lost connection unless it had committed (the
        answer to its COMMIT may be what was lost): no crawl action is logged twice."""
        unsure = False
        while True:
            try:
                if unsure and self.store.committed(writes):
                    return []
                return self.store.write_batch(writes)
            except ConnectionLost as exc:
                if exc.final:
                    raise
                log.warning("database %s: %s; reconnecting", self.store.path, exc)
                self.store.reconnect()
                unsure = True

    def _retrying(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args); a connection lost in the middle is reconnected and fn runs again."""
        while True:
            try:
                return fn(*args)
            except ConnectionLost as exc:
                if exc.final:
                    raise
                log.warning("database %s: %s; reconnecting", self.store.path, exc)
                self.store.reconnect()

    def _run_lookups(self, calls: list[_Call],
                     settled: dict[asyncio.AbstractEventLoop, list[tuple[Any, Any, Any]]]) -> None:
        """Pages' look-ups, in one round trip (many_page_lookups); if the database fails it, one
        by one, each with its own retries and errors. Empties `calls`."""
        if len(calls) > 1 and self.failed is None:
            try:
                answers = self.store.many_page_lookups([call.args for call in calls])
            except Exception as exc:  # the database's (or a bug): asked again one by one
                log.debug("database %s: look-ups one by one: %s", self.store.path, exc)
            else:
                for call, answer in zip(calls, answers, strict=True):
                    assert call.loop is not None  # only the loop's calls are collected
                    settled.setdefault(call.loop, []).append((call.future, answer, None))
                calls.clear()
        for call in calls:
            self._run(call, settled)
        calls.clear()

    def _run(self, call: _Call,
             settled: dict[asyncio.AbstractEventLoop, list[tuple[Any, Any, Any]]]) -> None:
        result: Any = None
        error: BaseException | None = self.failed
        if error is None:
            try:
                result = self._retrying(call.fn, *call.args)
            except ConnectionLost as exc:
                self._fail(exc)
                error = exc
            except BaseException as exc:  # the caller's to handle (StoreError, a bug)
                error = exc
        if call.loop is None:
            assert isinstance(call.future, concurrent.futures.Future)
            if error is None:
                call.future.set_result(result)
            else:
                call.future.set_exception(error)
        else:
            settled.setdefault(call.loop, []).append((call.future, result, error))

    def _fail(self, exc: StoreError) -> None:
        if self.failed is None:
            self.failed = exc  # told to every caller, and to on_failure: not logged (one line)
            if self.on_failure is not None:
                self.on_failure(exc)


def _settle_all(items: list[tuple[Any, Any, BaseException | None]]) -> None:
    for future, result, error in items:
        if future.cancelled():
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
