"""Distributed crawling: partitions, leases and the worker's view of the fleet (PostgreSQL only).

Registered domains hash into a fixed number of partitions. A worker leases its fair share of them
(lease rows with an expiry renewed by a heartbeat) and crawls only the configured origins of the
partitions it holds; links for other partitions are written to the database for their owner.
The crawler polls `Worker.poll` every `interval` seconds and asks `Worker.owns` before each turn.
docs/distributed.md explains the protocol, failover and the exit rule; `[fleet]` (config.py)
its settings.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import xxhash

from courtly.crawler import Crawler
from courtly.scheduler import FOR_THE_RUN, OriginCrawler
from courtly.stats import CrawlStats, StopKind
from courtly.store.postgres import PostgresStore
from courtly.urls import host_of, registered_domain

if TYPE_CHECKING:
    from courtly.config import CrawlConfig, FleetConfig
    from courtly.strategy import CrawlingStrategy

log = logging.getLogger("courtly")

#: a lease is trusted locally only up to this fraction of its length after the renewal was sent
_SAFETY = 0.8


def partition_key(origin: str) -> str:
    """What is hashed: the registered domain; IP literals and single-label hosts keep the origin.

    The public suffix list says nothing about 127.0.0.1:8001 vs 127.0.0.1:8002, which are
    different services; every origin is still crawled by one worker at a time either way.
    """
    host = host_of(origin + "/").strip("[]").lower()
    try:
        ipaddress.ip_address(host)
        return origin
    except ValueError:
        pass
    if "." not in host.rstrip("."):
        return origin
    return registered_domain(host)


def partition_of(origin: str, partitions: int) -> int:
    """The partition of an origin: a stable hash (xxh64) of its key modulo the partition count."""
    return xxhash.xxh64_intdigest(partition_key(origin).encode()) % partitions


@dataclass
class Plan:
    """What the crawler should do after a poll: crawl these origins; done: the fleet finished."""

    origins: list[str] = field(default_factory=list)
    done: bool = False
    scope: list[str] | None = None  # the configured origins, when they changed (new seeds)


class Worker:
    """One worker's membership in the fleet: its id, its leases, its answer to "mine?"."""

    def __init__(
        self, store: PostgresStore, settings: FleetConfig, continuous: bool = False
    ) -> None:
        self.store = store
        self.settings = settings
        self.continuous = continuous
        self.lease_seconds = settings.lease_seconds
        self.interval = max(0.05, min(5.0, self.lease_seconds / 4))
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.id = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:6]}"
        self.partitions = 0
        self.run = 0
        self.held: set[int] = set()  # leased and crawled
        self.releasing: set[int] = set()  # leased, being handed back (no new turns)
        self.valid_until = 0.0  # monotonic: our leases are trusted until then
        self._part_cache: dict[str, int] = {}
        self._new_origins: set[str] = set()
        self._busy: bool | None = None
        self._scope: list[str] | None = None

    # -- joining and leaving ---------------------------------------------------------------
    def join(self) -> int:
        """Register, make sure the partitions exist, join the fleet's run; returns the run id."""
        self.partitions = self.store.ensure_partitions(self.settings.partitions)
        self.store.register_worker(self.id, self.host, self.pid)
        self.store.worker = self.id
        self.run = self.store.join_run()
        log.info("worker %s joined run %d (%d partitions, leases of %.1fs)",
                 self.id, self.run, self.partitions, self.lease_seconds)
        return self.run

    def leave(self) -> None:
        """Give every lease back and mark this worker stopped (a clean exit)."""
        try:
            self.store.stop_workers([self.id])
        finally:
            self.held.clear()
            self.releasing.clear()

    # -- what the crawler asks -------------------------------------------------------------
    def part(self, origin: str) -> int:
        """The partition of an origin (cached)."""
        part = self._part_cache.get(origin)
        if part is None:
            part = self._part_cache[origin] = partition_of(origin, self.partitions)
        return part

    def owns(self, origin: str) -> bool:
        """May this worker send a request to this origin now?"""
        return self.part(origin) in self.held and time.monotonic() < self.valid_until

    def new_origin(self, origin: str) -> None:
        """A link found a new origin within the scope: make it configured, for whoever owns it."""
        if origin not in self._new_origins:
            self._new_origins.add(origin)
            self.store.add_origins([origin])

    def poll(
        self, active: Iterable[str], finished: Iterable[OriginCrawler], actions: int, due: float
    ) -> Plan:
        """Heartbeat, rebalance the leases, and say which origins to crawl (or that all is done).

        `active`: origins with a live origin crawler; `finished`: crawlers that ended since the
        last poll (those that gave up are finished for the run, fleet-wide).
        """
        store = self.store
        active = set(active)
        given_up = [c.origin for c in finished if self.owns(c.origin) and _gave_up(c)]
        if given_up:
            log.info("finished for this run: %s", ", ".join(given_up))
            store.give_up(given_up, self.run)
        self._assign_partitions()
        sent = time.monotonic()
        held = set(store.heartbeat(self.id, self.lease_seconds, actions))
        lost = (self.held | self.releasing) - held
        if lost:
            log.warning("lost the leases of partitions %s", sorted(lost))
        self.held &= held
        self.releasing &= held
        self.valid_until = sent + self.lease_seconds * _SAFETY
        self._rebalance(active, held)
        work = [o for o in store.origins_with_work(sorted(self.held), self.run, due)
                if o not in active]
        busy = bool(active or work)
        if busy != self._busy:
            # committed before any of this work is taken: see fleet_done
            store.set_busy(self.id, busy)
            self._busy = busy
        scope = store.configured_origins()
        changed = scope if scope != self._scope else None
        self._scope = scope
        if busy or self.continuous:
            return Plan(work, scope=changed)
        return Plan(done=store.fleet_done(self.id, self.run, due), scope=changed)

    async def follow(self, crawl: Crawler) -> None:
        """Hand the crawl the origins our leases give it, until the fleet is done."""
        while not crawl.turns.stopping:
            finished = crawl.turns.forget_finished()
            plan = self.poll(crawl.crawlers, finished, crawl.stats.actions, crawl.due_time())
            if plan.scope is not None:  # seeds were added
                crawl.rescope(plan.scope)
            for origin in plan.origins:
                crawl.take_over(origin)
            if plan.done:
                crawl.fleet_finished()
                return
            # poll again after the interval, or as soon as the last origin crawler finishes
            busy = bool(crawl.crawlers)
            end = time.monotonic() + (self.interval if busy else min(self.interval, 1.0))
            while time.monotonic() < end and not crawl.turns.stopping:
                if busy and all(c.finished for c in crawl.crawlers.values()):
                    break
                await asyncio.sleep(0.02)

    # -- inside a poll ---------------------------------------------------------------------
    def _assign_partitions(self) -> None:
        missing = self.store.origins_without_partition()
        if missing:
            self.store.set_partitions([(self.part(o), o) for o in missing])

    def _rebalance(self, active: set[str], held: set[int]) -> None:
        store = self.store
        live, local = store.fleet(self.host)
        check = self.settings.same_host_pid_check
        dead = [wid for wid, pid in local if check and wid != self.id and not _pid_alive(pid)]
        if dead:  # a worker on this machine was killed: its leases need not wait to expire
            log.warning("workers %s on this host are gone; freeing their leases", dead)
            store.stop_workers(dead)
            live, _ = store.fleet(self.host)
        share = math.ceil(self.partitions / max(1, live))
        if len(held) > share:
            extra = sorted(held, reverse=True)[: len(held) - share]
            self.releasing = set(extra)
            self.held = held - self.releasing
        else:
            self.held = set(held)
            self.releasing = set()
        if self.releasing:
            # hand back only partitions none of whose origins is still being crawled here
            busy_parts = {self.part(o) for o in active}
            free = sorted(self.releasing - busy_parts)
            store.release(self.id, free)
            self.releasing -= set(free)
        elif len(self.held) < share:
            gained = store.acquire(self.id, self.run, share - len(self.held), self.lease_seconds)
            if gained:
                log.info("leased partitions %s", gained)
                self.held |= set(gained)


def _gave_up(crawler: OriginCrawler) -> bool:
    """An origin crawler that stopped although work may remain: no retry this run."""
    ending = crawler.ending
    return crawler.patience <= 0 or (ending is not None and ending.kind in FOR_THE_RUN)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_worker(
    store: PostgresStore,
    config: CrawlConfig,
    strategy: CrawlingStrategy,
    new_strategy: Callable[[], CrawlingStrategy],
    on_progress: Callable[[CrawlStats], None] | None = None,
    continuous: bool = False,
) -> CrawlStats:
    """Run this process as one worker until the fleet is done, a signal, or the database is gone.

    A connection lost between two statements is retried inside the store (with backoff); one
    lost inside a transaction stops the crawl pass, which rolled back: the worker gives its
    leases back and joins again, up to fleet.restarts times, then stops with the store's message.
    """
    restarts, most = 0, config.fleet.restarts
    store.retry_seconds = config.fleet.reconnect_seconds
    while True:
        worker = Worker(store, config.fleet, continuous)
        crawler = Crawler(config, store, strategy, on_progress=on_progress, fleet=worker)
        try:
            stats = asyncio.run(crawler.run())
        finally:
            try:
                worker.leave()
            except Exception as exc:  # the database is gone: the leases will expire
                log.warning("could not give the leases back: %s", exc)
        lost = stats.stop is not None and stats.stop.kind is StopKind.CONNECTION_LOST
        if not lost or restarts >= most:
            return stats
        restarts += 1
        log.warning("%s; joining the crawl again (%d/%d)", stats.stop_reason, restarts, most)
        strategy = new_strategy()


def print_fleet(fleet: dict[str, Any]) -> None:
    """`courtly stats` on PostgreSQL: the workers, their leases and their rates."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"[bold]{len(fleet['workers'])}[/] workers, {fleet['partitions']} partitions "
        f"({fleet['free_partitions']} not leased)"
    )
    table = Table(title="workers", title_justify="left")
    for column in ("worker", "state", "leases", "actions", "pages/s", "pages/s (last min)",
                   "heartbeat age"):
        table.add_column(column, justify="left" if column in ("worker", "state") else "right")
    for w in fleet["workers"]:
        table.add_row(w["worker"], w["state"], str(w["leases"]), str(w["actions"]),
                      f"{w['rate']:.2f}", f"{w['rate_last_minute']:.2f}",
                      f"{w['heartbeat_age']:.1f}s")
    console.print(table)
