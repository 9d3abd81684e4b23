"""Origin crawlers and the penalty box: who may send the next request, and when."""

from __future__ import annotations

import asyncio
import gc
import heapq
import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from enum import Enum, auto
from typing import Any

from courtly.config import Politeness
from courtly.model import Candidate, OriginState
from courtly.policy import ShapeBudget
from courtly.robots import RobotsRules
from courtly.stats import CrawlStats
from courtly.urls import host_of, registered_domain

log = logging.getLogger("courtly")


@dataclass(slots=True)
class KeyGate:
    """What the origins of one politeness key share: one request at a time, one delay."""

    key: str
    next_request_at: float = 0.0  # monotonic: no request to any of its origins before then
    busy: bool = False  # a turn of one of its origins runs
    waiting: deque[OriginCrawler] = field(default_factory=deque)  # released while it was busy


#: the garbage collector's first threshold while turns run (CPython's is 700): the objects of the
#: turns in flight, alive at every young collection, were promoted until the oldest generation
#: (every origin's record, frozen now when the turns begin) was scanned every 2.5 s, a third of
#: a 30,000-origin crawl's CPU (bench/RESULTS.md, "Broad crawl")
YOUNG_OBJECTS = 10_000
#: an origin that waits longer than this for its next turn holds no todo list meanwhile
REST_AFTER = 5.0
#: the todo list of an origin whose delay is that long: what a few turns use
RESTING_BATCH = 4


class EndKind(Enum):
    """Why an origin crawler ends before its work does."""

    OUT_OF_PATIENCE = auto()
    ROBOTS_UNAVAILABLE = auto()  # robots.txt unreachable or 5xx, and no recent copy
    TRAP = auto()  # a trap guard of the whole origin (traps.max_pages_per_origin)
    CRAWL_DELAY = auto()  # robots.txt asks for a Crawl-delay above the cap (skip)


#: endings after which the origin is finished for the run, fleet-wide, whatever work remains
FOR_THE_RUN = frozenset({EndKind.TRAP, EndKind.CRAWL_DELAY})


@dataclass(frozen=True, slots=True)
class Ending:
    """Why an origin crawler finished (or would finish now) before its work did."""

    kind: EndKind
    text: str


@dataclass(slots=True)
class OriginCrawler:
    """The per-origin crawl loop's state: robots.txt, todo list, delay, patience.

    Compact while it waits (a few hundred bytes, docs/scaling.md): slots, the robots.txt rules
    shared with the origins whose file is the same (robots_cache.py), the last response times
    a tuple, and no todo list while it waits more than REST_AFTER (`rest`).
    """

    origin: str
    state: OriginState
    patience: int
    robots: RobotsRules | None = None
    robots_expires: float = 0.0  # monotonic time at which robots.txt must be fetched again
    todo: list[Candidate] = field(default_factory=list)  # the next first
    own_next_request_at: float = 0.0  # see next_request_at
    last_request: float = 0.0  # monotonic: when its last request ended (0: none in this run)
    response_times: tuple[float, ...] = ()  # the last 5, oldest first
    backoff_ends: float = 0.0  # monotonic end of the last backoff pause: quiet from then on
    pages_this_run: int = 0
    shapes: ShapeBudget = field(default_factory=lambda: ShapeBudget(0))  # crawl actions by shape
    finished: bool = False
    ending: Ending | None = None  # why it would finish now, were it to (None: no work left)
    gate: KeyGate | None = None  # shared with the origins of its politeness key (None: its own)
    in_turn: bool = False  # a turn of this origin is running now

    @property
    def gave_up(self) -> bool:
        """Whether it stops although work may remain: out of patience, or an ending for the run.
        An ending with patience left only says why it would finish now: an origin that then
        runs out of work finished, it did not stop early."""
        ending = self.ending
        return self.patience <= 0 or (ending is not None and ending.kind in FOR_THE_RUN)

    def answered_in(self, seconds: float) -> None:
        """Keep a response time (the adaptive delay reads the last 5)."""
        self.response_times = (*self.response_times[-4:], seconds)

    def rest(self) -> None:
        """It waits long: its todo list goes (take_todo wrote nothing: the next turn reads the
        same candidates from the database again)."""
        self.todo.clear()

    @property
    def next_request_at(self) -> float:
        """Monotonic time before which no request goes to this origin (nor to its key's)."""
        return self.own_next_request_at if self.gate is None else self.gate.next_request_at

    @next_request_at.setter
    def next_request_at(self, at: float) -> None:
        if self.gate is None:
            self.own_next_request_at = at
        else:
            self.gate.next_request_at = at


def todo_batch(crawler: OriginCrawler, batch: int, rules: Politeness) -> int:
    """How many URLs the origin's todo list takes at a time: the strategy's batch, or a few when
    the origin rests between turns (docs/scaling.md)."""
    batch = max(1, batch)
    return min(batch, RESTING_BATCH) if delay_for(crawler, rules) > REST_AFTER else batch


def politeness_key(origin: str, kind: str) -> str:
    """The key of an origin for `politeness_key` origin, host or domain (ip: the crawl loop
    resolves the host)."""
    if kind == "origin":
        return origin
    host = host_of(origin + "/")
    return registered_domain(host) if kind == "domain" else host


class PenaltyBox:
    """Origins keyed by the earliest time each may take its next turn (a heap)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, OriginCrawler]] = []
        self._seq = itertools.count()

    def push(self, crawler: OriginCrawler, at: float) -> None:
        """Put an origin in the box until monotonic time `at`."""
        heapq.heappush(self._heap, (at, next(self._seq), crawler))

    def peek_time(self) -> float | None:
        """When the next origin is released, or None if the box is empty."""
        return self._heap[0][0] if self._heap else None

    def pop(self) -> OriginCrawler:
        """Release the origin whose time comes first."""
        return heapq.heappop(self._heap)[2]

    def __len__(self) -> int:
        return len(self._heap)


#: one turn of an origin: when it may go again, or None when it is finished
Turn = Callable[[OriginCrawler], Awaitable[float | None]]
#: the politeness key of an origin (None: each origin is its own key)
KeyOf = Callable[[str], Awaitable[str]]
#: the address a request to host:port goes to (None: it has none)
AddressOf = Callable[[str, int], Awaitable[str | None]]


def key_of(kind: str, address_of: AddressOf) -> KeyOf | None:
    """The gate key of an origin for `politeness_key` host, domain or ip (None for origin: each
    origin is its own); with ip, the address its requests go to (resolved once: the fetcher's
    DNS cache keeps it)."""
    if kind == "origin":
        return None

    async def key(origin: str) -> str:
        if kind != "ip":
            return politeness_key(origin, kind)
        host = host_of(origin + "/")
        address = await address_of(host, int(origin.rpartition(":")[2]))
        return address or host  # no address: its requests fail, alone

    return key


class Turns:
    """The origin crawlers of a crawl taking turns: the penalty box releases each as its time
    comes, at most `concurrency` at once; an origin is out of the box while its turn runs, so it
    never has two. An origin whose turn says None is finished (reopened if work comes).

    With a politeness key (key_of), the origins of one key share a gate: one turn at a time
    and one next_request_at; an origin released while its gate is busy waits behind it, and the
    waiting origins take the gate in turn (round robin).
    """

    def __init__(
        self, concurrency: int, turn: Turn,
        failed: Callable[[OriginCrawler | None, Exception], None],
        stats: CrawlStats, key_of: KeyOf | None = None,
    ) -> None:
        self.box = PenaltyBox()
        self.crawlers: dict[str, OriginCrawler] = {}
        self._turn, self._failed, self._stats = turn, failed, stats
        self._key_of = key_of
        self._gates: dict[str, KeyGate] = {}
        self._stop = asyncio.Event()
        self._free = concurrency  # turns that may start now
        self._waiter: asyncio.Future[None] | None = None  # the release loop's, while it waits
        self._tasks: set[asyncio.Task[None]] = set()
        self._running: dict[str, asyncio.Task[None]] = {}  # origin → its turn
        self._revoked: set[str] = set()  # origins whose turn was cancelled by `revoke`
        self._forgotten: set[str] = set()  # finished origins removed (counted finished)
        self._concurrency = concurrency
        self._beside: dict[str, asyncio.Task[None]] = {}  # origin → its last action's end
        #: the running loop, kept by `run`: asking for it asks getpid() on 3.11
        self._loop: asyncio.AbstractEventLoop

    @property
    def stopping(self) -> bool:
        """No new turn starts."""
        return self._stop.is_set()

    def add(self, crawler: OriginCrawler, at: float) -> None:
        """A new origin crawler, its first turn at monotonic time `at`."""
        if crawler.origin in self._forgotten:  # a fleet's origin back: no longer finished
            self._forgotten.discard(crawler.origin)
            self._stats.origins_finished -= 1
        self.crawlers[crawler.origin] = crawler
        # the origins crawled here (a worker's own, not its fleet's configured origins)
        self._stats.origins_total = len(self.crawlers) + len(self._forgotten)
        self.box.push(crawler, at)
        self.wake()

    def reopen(self, crawler: OriginCrawler) -> None:
        """An origin that ran out of work gets new links: back into the penalty box."""
        if crawler.gave_up or self._stop.is_set():
            return  # it gave up for this run
        crawler.finished = False
        self._stats.origins_finished -= 1
        self.box.push(crawler, max(time.monotonic(), crawler.next_request_at))
        self.wake()

    def live_state(self, origin: str) -> OriginState | None:
        """The state of an origin being crawled (None: no crawler for it)."""
        crawler = self.crawlers.get(origin)
        return None if crawler is None else crawler.state

    def forget_finished(self) -> list[OriginCrawler]:
        """The origin crawlers that finished, removed (added again if they get work)."""
        finished = [c for c in self.crawlers.values() if c.finished]
        for crawler in finished:
            del self.crawlers[crawler.origin]
            self._forgotten.add(crawler.origin)
        return finished

    def running(self) -> list[str]:
        """The origins whose turn, or whose last crawl action's end (`beside`), is under way."""
        return list(self._running.keys() | self._beside.keys())

    async def beside(self, crawler: OriginCrawler, end: Coroutine[Any, Any, None]) -> None:
        """Run `end`, the rest of the origin's crawl action (reading its body, recording it),
        beside the origin's next turns, which wait for it with `settled`; at once when
        `concurrency` such ends are already running (they hold bodies). It counts as in flight
        (--max-actions) and is drained as a turn is; one that raises is a turn that failed."""
        if len(self._beside) >= self._concurrency:
            await end
            return
        task = self._loop.create_task(self._end(crawler, end))
        self._stats.in_flight += 1
        self._beside[crawler.origin] = task
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._ended(crawler.origin, end, done))

    async def _end(self, crawler: OriginCrawler, end: Coroutine[Any, Any, None]) -> None:
        try:
            await end
        except Exception as exc:  # the crawl decides what stops; the origin is finished
            self._failed(crawler, exc)
        finally:  # now, not a loop iteration later: the origin's next end may begin at once
            self._forget(crawler.origin, asyncio.current_task(self._loop))

    def _ended(self, origin: str, end: Coroutine[Any, Any, None], task: asyncio.Task[None]
               ) -> None:
        self._forget(origin, task)  # cancelled before it began
        end.close()  # (then it was never awaited)
        self._done(task)

    def _forget(self, origin: str, task: asyncio.Task[Any] | None) -> None:
        if self._beside.get(origin) is task:
            del self._beside[origin]
            self._stats.in_flight -= 1

    async def settled(self, crawler: OriginCrawler) -> None:
        """Wait until the origin's last crawl action is recorded (see `beside`)."""
        task = self._beside.get(crawler.origin)
        if task is not None:
            await asyncio.wait((task,))  # cancelling the waiting turn does not cancel it

    def revoke(self, keep: Callable[[str], bool]) -> None:
        """Cancel the running turns of the origins `keep` says no to (a fleet's lost lease): the
        URL in flight is not recorded, and the origin is finished here."""
        for origin, task in list(self._running.items()):
            if origin not in self._revoked and not keep(origin):
                self._revoked.add(origin)
                task.cancel()

    def wake(self) -> None:
        """Look again: the loop may end (or an origin has come, or a turn ended)."""
        _resolve(self._waiter)

    def stop(self) -> None:
        """Start no new turn."""
        self._stop.set()
        self.wake()

    async def run(self, more: Callable[[], bool], helpers: list[Coroutine[Any, Any, None]]
                  ) -> None:
        """Run turns until stopped, or until the box is empty, no turn runs and not `more()`;
        `helpers` run beside them (one that raises is a turn that failed) until the end."""
        loop = self._loop = asyncio.get_running_loop()
        beside = [loop.create_task(self._helper(job)) for job in helpers]
        thresholds = gc.get_threshold()
        gc.freeze()  # the origins' records, the modules: built once, never scanned again
        gc.set_threshold(YOUNG_OBJECTS, *thresholds[1:])
        try:
            await self._release(loop, more)
        finally:
            gc.set_threshold(*thresholds)
            gc.unfreeze()
            for task in beside:
                task.cancel()

    async def _helper(self, job: Coroutine[Any, Any, None]) -> None:
        try:
            await job
        except Exception as exc:  # the crawl decides what stops
            self._failed(None, exc)

    async def _release(self, loop: asyncio.AbstractEventLoop, more: Callable[[], bool]) -> None:
        while not self._stop.is_set():
            at = self.box.peek_time()
            if at is None:
                if not self._tasks and not more():
                    return
                await self._wait(loop, None)
                continue
            delay = at - time.monotonic()
            if delay > 0:
                await self._wait(loop, delay)
                continue
            if not self._free:  # `concurrency` turns run: one ends first
                await self._wait(loop, None)
                continue
            crawler = self.box.pop()
            gate = crawler.gate
            if gate is not None and gate.busy:
                gate.waiting.append(crawler)  # released when its key's turn is over
                continue
            self._free -= 1
            if gate is not None:
                gate.busy = True
            task = loop.create_task(self._run(crawler))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.wake()

    async def _wait(self, loop: asyncio.AbstractEventLoop, timeout: float | None) -> None:
        """Until `wake` or `timeout` seconds: a future and a timer (asyncio.wait_for on an Event
        made a task, a future and a timer each time; a Semaphore scanned its waiters)."""
        waiter = self._waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _resolve, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def _run(self, crawler: OriginCrawler) -> None:
        # revocable once started: a task cancelled before its first step would run no cleanup
        self._running[crawler.origin] = asyncio.current_task(self._loop)  # type: ignore[assignment]
        self._stats.in_flight += 1
        crawler.in_turn = True
        at = None
        try:
            if not await self._through_gate(crawler):
                return  # another origin of its key has the gate: it waits behind it
            try:
                at = await self._turn(crawler)
            except Exception as exc:  # the crawl decides what stops; the origin is finished
                self._failed(crawler, exc)
        except asyncio.CancelledError:
            if crawler.origin not in self._revoked:
                raise
            log.info("%s: turn cancelled, its lease is lost", crawler.origin)
        finally:
            self._stats.in_flight -= 1
            crawler.in_turn = False
            self._free += 1
            self._running.pop(crawler.origin, None)
            self._revoked.discard(crawler.origin)
        self._after_turn(crawler, at)
        self.wake()

    async def _through_gate(self, crawler: OriginCrawler) -> bool:
        """An origin's first turn with a politeness key: find its gate and take it if free."""
        if crawler.gate is not None or self._key_of is None:
            return True  # its own key, or the gate taken when the turn was started
        key = await self._key_of(crawler.origin)
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = KeyGate(key)
        gate.next_request_at = max(gate.next_request_at, crawler.own_next_request_at)
        crawler.gate = gate
        if gate.busy:
            gate.waiting.append(crawler)
            return False
        gate.busy = True
        return True

    def _after_turn(self, crawler: OriginCrawler, at: float | None) -> None:
        """Back into the box at `at` (None: finished); an origin waiting for the gate is next."""
        gate = crawler.gate
        if gate is not None:
            gate.busy = False
            if gate.waiting:  # the next origin of its key takes the gate
                self.box.push(gate.waiting.popleft(), gate.next_request_at)
                if at is not None:
                    gate.waiting.append(crawler)  # after the others of its key
                    return
        if at is None:
            self._finish(crawler)
        else:
            if at - time.monotonic() > REST_AFTER:
                crawler.rest()
            self.box.push(crawler, at)

    def _finish(self, crawler: OriginCrawler) -> None:
        crawler.finished = True
        self._stats.origins_finished += 1
        ending = crawler.ending if crawler.gave_up else None
        if ending:
            self._stats.stopped_early[crawler.origin] = ending.text
        why = ending.text if ending else "done"
        log.info("%s finished: %s", crawler.origin, why)

    async def drain(self) -> None:
        """Let running turns (and the ends they start) finish for a moment, then cancel them
        (their URLs stay queued)."""
        deadline = time.monotonic() + 2.0
        while self._tasks and time.monotonic() < deadline:
            await asyncio.wait(set(self._tasks), timeout=deadline - time.monotonic())
        pending = list(self._tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def _resolve(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def effective_crawl_delay(crawl_delay: float | None, rules: Politeness) -> float | None:
    """Crawl-delay as obeyed: clamped to the cap, or None if the origin must be skipped."""
    if crawl_delay is None:
        return 0.0
    if crawl_delay <= rules.max_crawl_delay:
        return crawl_delay
    return rules.max_crawl_delay if rules.crawl_delay_above_cap == "clamp" else None


def delay_for(crawler: OriginCrawler, rules: Politeness) -> float:
    """Delay between two requests: max(minimum, Crawl-delay up to its cap, adaptive delay)."""
    delay = rules.min_delay
    crawl_delay = effective_crawl_delay(crawler.state.crawl_delay, rules)
    if crawl_delay:
        delay = max(delay, crawl_delay)
    if rules.adaptive_factor and crawler.response_times:
        mean = sum(crawler.response_times) / len(crawler.response_times)
        delay = max(delay, rules.adaptive_factor * mean)
    return delay


def retry_after_seconds(value: str | None, now_wall: float) -> float | None:
    """Parse Retry-After (delta seconds or an HTTP date) into seconds from now."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # delay-seconds is ASCII digits ("²" is a digit)
        return float(value)
    when = http_date(value)
    return None if when is None else max(0.0, when - now_wall)


def http_date(value: str | None) -> float | None:
    """An HTTP-date (Retry-After, Date, Last-Modified) as seconds since the epoch; None when it
    is none."""
    if not value:
        return None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return None if when is None else float(when.timestamp())


def backoff(
    crawler: OriginCrawler, retry_after: float | None, rules: Politeness, now: float, jitter: float
) -> tuple[int, float]:
    """The origin's next backoff level and the seconds to stay away after a 429/503 or an
    unavailable robots.txt: Retry-After (capped), else exponential backoff × jitter (1 to 1.5).
    Pure: reads the crawler, changes nothing."""
    level = crawler.state.backoff_level
    if now - crawler.backoff_ends > rules.backoff_forgive_after:
        level = 0  # forgiven after a quiet period (the pause itself is not one)
    level += 1
    if retry_after is not None:
        return level, min(retry_after, rules.retry_after_cap)
    return level, min(rules.backoff_max, rules.backoff_base * 2.0 ** (level - 1) * jitter)


def backoff_jitter() -> float:
    """The random factor of an exponential backoff (so that origins do not come back in step)."""
    return random.uniform(1.0, 1.5)


def pause(crawler: OriginCrawler, level: int, seconds: float, now: float) -> None:
    """Apply a backoff decision: the origin stays away `seconds` from monotonic time `now`."""
    crawler.state.backoff_level = level
    crawler.backoff_ends = crawler.next_request_at = now + seconds
