"""Distributed crawling: partitions, leases and the worker's view of the fleet (PostgreSQL only).

Registered domains hash into a fixed number of partitions. A worker leases its fair share of them
(lease rows with an expiry renewed by a heartbeat) and crawls only the configured origins of the
partitions it holds; links for other partitions are written to the database for their owner.
`Worker.follow` polls (on the database thread) every `interval` seconds and drives the crawl
through `steering.Steering`; the crawl asks `Worker.owns` before each turn and each request, and
fences each write with `Worker.lease`.
docs/distributed.md explains the protocol, fencing, failover and the exit rule.
Configuration: the `[fleet]` section (lease_seconds, partitions, reconnect_seconds).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from courtly.crawler import Crawler
from courtly.processes import pid_alive
from courtly.scheduler import OriginCrawler
from courtly.stats import CrawlStats, StopKind
from courtly.steering import Steering
from courtly.store.base import ConnectionLost, StoreError, Write
from courtly.store.postgres import PostgresStore
from courtly.store.thread import DatabaseThread
from courtly.urls import partition_of

if TYPE_CHECKING:
    from courtly.config import CrawlConfig, FleetConfig
    from courtly.strategy import CrawlingStrategy

log = logging.getLogger("courtly")

#: a lease is trusted locally only up to this fraction of its length after the renewal was sent
_SAFETY = 0.8
#: between polls, the fleet's membership is read this often (seconds): a worker that joins or
#: leaves gets its share planned at once (with polls an interval apart, a worker started a
#: moment after another waited up to lease_seconds / 4 for its first partition)
MEMBERS_CHECK = 0.25
#: configuration keys of one worker alone (its machine, its own run, its output); the fleet's
#: workers should agree on every other (delays, robots.txt, policies, strategy, …): a worker
#: that joins with another value says so (`shared_settings`)
OWN_SETTINGS = frozenset({
    "seeds", "seeds_file", "db", "max_actions", "min_delay", "obey_robots", "concurrency",
    "commit_interval", "force_recrawl", "parse_workers", "progress", "serve", "warc", "proxy",
    "ca_bundle", "limits.max_connections", "limits.dns_hosts", "limits.local_error_wait",
    "fleet.partitions", "fleet.reconnect_seconds", "fleet.batch_window",
    "fleet.same_host_pid_check",
})


@dataclass
class Plan:
    """What the crawler should do after a poll: crawl these origins; done: the fleet finished."""

    origins: list[str] = field(default_factory=list)
    done: bool = False
    scope: list[str] | None = None  # the configured origins, when they changed (new seeds)
    seeds: list[str] = field(default_factory=list)  # then the seeds' origins


class Worker:
    """One worker's membership in the fleet: its id, its leases, its answer to "mine?"."""

    def __init__(
        self, store: PostgresStore, settings: FleetConfig, continuous: bool = False,
        shared: dict[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.shared = shared or {}  # the configuration the fleet's workers should share
        self.continuous = continuous
        self.lease_seconds = settings.lease_seconds
        self.interval = max(0.05, min(5.0, self.lease_seconds / 4))
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.id = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:6]}"
        self.partitions = 0
        self.run = 0
        # sets and dicts below are replaced, never changed in place: the database thread polls,
        # the event loop reads them
        self.held: set[int] = set()  # leased and crawled
        self.releasing: set[int] = set()  # leased, being handed back (no new turns)
        self.epochs: dict[int, int] = {}  # the epoch of each lease we hold or last held
        self.valid_until = 0.0  # monotonic: our leases are trusted until then
        self._part_cache: dict[str, int] = {}
        self._new_origins: set[str] = set()
        self._unsaved_origins: list[str] = []  # new origins found, written at the next poll
        self._wanted: set[int] = set()  # the partitions planned for this worker at the last poll
        self._weights: dict[int, int] = {}  # the partitions' origins (plan_shares' weights)
        self._weighed = -math.inf  # monotonic: when they were counted
        self._busy: bool | None = None
        self._scope: list[str] | None = None
        self._joined = 0.0  # monotonic: when this worker joined (fast polls for a while)
        self._members: tuple[int, float] | None = None  # the fleet's membership at the last poll

    # -- joining and leaving ---------------------------------------------------------------
    def join(self) -> int:
        """Register, make sure the partitions exist, join the fleet's run; returns the run id."""
        self.partitions = self.store.ensure_partitions(self.settings.partitions)
        if "partitions" in self.settings.model_fields_set and (
                self.partitions != self.settings.partitions):
            log.warning("[fleet] partitions = %d is not used: this crawl has %d partitions, "
                        "fixed when its first worker joined", self.settings.partitions,
                        self.partitions)
        self.store.register_worker(self.id, self.host, self.pid, json.dumps(self.shared))
        self.store.worker = self.id
        self.run = self.store.join_run()
        self._joined = time.monotonic()
        log.info("worker %s joined run %d (%d partitions, leases of %.1fs)",
                 self.id, self.run, self.partitions, self.lease_seconds)
        self._compare_settings()
        return self.run

    def _compare_settings(self) -> None:
        """One warning line when a live worker of the fleet crawls with another configuration."""
        for peer, text in self.store.peer_settings(self.id):
            differ = differences(self.shared, text)
            if differ:
                more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
                log.warning("this worker's configuration differs from worker %s's: %s%s; give "
                            "every worker of the fleet the same (docs/distributed.md)",
                            peer, ", ".join(differ[:3]), more)
                return

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

    def holds(self, origin: str) -> bool:
        """Is a turn of this origin still covered by our lease (one being handed back still is:
        its running turns finish; no new one starts)?"""
        part = self.part(origin)
        return (part in self.held or part in self.releasing) and (
            time.monotonic() < self.valid_until)

    def lease(self, origin: str) -> tuple[int, int]:
        """The lease a write for this origin is fenced with: (partition, the epoch we hold or
        last held; -1 if never: the database refuses it)."""
        part = self.part(origin)
        return part, self.epochs.get(part, -1)

    def refused(self, writes: list[Write]) -> None:
        """The database refused these writes (database thread): their leases are gone."""
        parts = {w.lease[0] for w in writes if w.lease is not None}
        log.warning("lost the leases of partitions %s: %d writes refused", sorted(parts),
                    len(writes))
        self.held = self.held - parts
        self.releasing = self.releasing - parts

    def new_origin(self, origin: str) -> None:
        """A link found a new origin within the scope: make it configured, for whoever owns it
        (written at the next poll)."""
        if origin not in self._new_origins:
            self._new_origins.add(origin)
            self._unsaved_origins.append(origin)

    def poll(
        self, active: Iterable[str], finished: Iterable[OriginCrawler], actions: int, due: float,
        running: Iterable[str] = (),
    ) -> Plan:
        """Heartbeat, rebalance the leases, and say which origins to crawl (or that all is done).

        `active`: origins with a live origin crawler, `running` those with a turn under way or
        a crawl action not yet committed (a partition is handed back once none of its origins
        has one); `finished`: crawlers that ended since the last poll (those that gave up are
        finished for the run, fleet-wide).
        """
        store = self.store
        active = set(active)
        given_up = [c.origin for c in finished if self.owns(c.origin) and c.gave_up]
        # the heartbeat first: nothing else of the poll (rows another worker may hold locked)
        # delays the renewal
        sent = time.monotonic()
        renewed = dict(store.heartbeat(self.id, self.lease_seconds, actions))
        held = set(renewed)
        lost = (self.held | self.releasing) - held
        if lost:
            log.warning("lost the leases of partitions %s", sorted(lost))
        self.epochs = {**self.epochs, **renewed}
        self.held = self.held & held
        self.releasing = self.releasing & held
        self.valid_until = sent + self.lease_seconds * _SAFETY
        found, self._unsaved_origins = self._unsaved_origins, []
        if found:
            store.add_origins(found)
        if given_up:
            log.info("finished for this run: %s", ", ".join(given_up))
            store.give_up(given_up, self.run)
        self._assign_partitions()
        self._members = store.members()
        self._rebalance(set(running), held)
        work = [o for o in store.origins_with_work(sorted(self.held), self.run, due)
                if o not in active]
        busy = bool(active or work)
        if busy != self._busy:
            # committed before any of this work is taken: see fleet_done
            store.set_busy(self.id, busy)
            self._busy = busy
        scope = store.configured_origins()
        changed = scope if scope != self._scope else None
        seeds = store.seed_origins() if changed is not None else []
        self._scope = scope
        if busy or self.continuous:
            return Plan(work, scope=changed, seeds=seeds)
        return Plan(done=store.fleet_done(self.id, self.run, due), scope=changed, seeds=seeds)

    async def follow(self, crawl: Steering) -> None:
        """Hand the crawl the origins our leases give it, until the fleet is done; a turn of an
        origin whose lease is lost or in doubt is cancelled (it never outlives the lease)."""
        polls = DatabaseThread(self.store)  # its own connection: writes never delay a renewal
        try:
            await self._follow(crawl, polls)
        finally:  # off the loop: its call may wait for a lost server, and a signal must get in
            await asyncio.to_thread(polls.close)

    async def _follow(self, crawl: Steering, polls: DatabaseThread) -> None:
        while not crawl.turns.stopping:
            finished = crawl.turns.forget_finished()
            under_way = _under_way(crawl)  # busy until its crawl actions are committed
            plan = await polls.call(self.poll, [*crawl.turns.crawlers, *under_way], finished,
                                    crawl.stats.actions, crawl.due_time(), under_way)
            if plan.scope is not None:  # seeds were added
                crawl.rescope(plan.scope, plan.seeds)
            # at once: one by one, each origin's state waited for a turn of the busy database
            # thread (200 origins took seconds, and no poll handed a joining worker its share)
            await asyncio.gather(*(crawl.take_over(origin) for origin in plan.origins))
            if plan.done:
                crawl.finish()
                return
            # poll again after the interval; within a second when idle; within a quarter of
            # one while the shares move (partitions to hand back or to take) and for two
            # intervals after joining, when workers started together are still registering
            # (the first takes every partition and hands the others theirs a poll later: each
            # poll's wait is a wait for a worker with nothing to crawl); as soon as the last
            # origin crawler finishes, as soon as the partitions being handed back have no
            # turn or write left (the joining worker gets them a poll sooner), or as soon as a
            # worker joins or leaves (checked every MEMBERS_CHECK seconds: its share is
            # planned at once, not an interval later)
            busy = bool(crawl.turns.crawlers)
            moving = bool(self.releasing) or not self._wanted <= self.held or (
                time.monotonic() < self._joined + 2 * self.interval)
            wait = 0.25 if moving else (self.interval if busy else 1.0)
            now = time.monotonic()
            end, check = now + min(self.interval, wait), now + MEMBERS_CHECK
            while time.monotonic() < end and not crawl.turns.stopping:
                crawl.turns.revoke(self.holds)
                if busy and all(c.finished for c in crawl.turns.crawlers.values()):
                    break
                if self.releasing and self.releasing.isdisjoint(
                        self.part(o) for o in _under_way(crawl)):
                    break
                if time.monotonic() >= check:
                    if await polls.call(self.store.members) != self._members:
                        break
                    check = time.monotonic() + MEMBERS_CHECK
                await asyncio.sleep(0.02)

    # -- inside a poll ---------------------------------------------------------------------
    def _assign_partitions(self) -> None:
        missing = self.store.origins_without_partition()
        if missing:
            self.store.set_partitions([(self.part(o), o) for o in missing])

    def _rebalance(self, running: set[str], held: set[int]) -> None:
        store = self.store
        # live: a heartbeat within half a lease (they come every quarter): a worker whose
        # leases expire is no longer counted by then, so no partition is planned for it
        recent = self.lease_seconds / 2
        live, local = store.fleet(self.host, recent)
        check = self.settings.same_host_pid_check
        dead = [wid for wid, pid in local if check and wid != self.id and not pid_alive(pid)]
        if dead:  # a worker on this machine was killed: its leases need not wait to expire
            log.warning("workers %s on this host are gone; freeing their leases", dead)
            store.stop_workers(dead)
            live, _ = store.fleet(self.host, recent)
        now = time.monotonic()
        if now >= self._weighed + self.interval:  # a count over every origin: not each poll
            self._weights, self._weighed = store.partition_weights(self.run), now
        holders = {**store.lease_holders(), **dict.fromkeys(held, self.id)}
        mine = self._wanted = plan_shares(sorted({*live, self.id}), self.partitions,
                                          self._weights, holders)[self.id]
        marked = self.releasing  # since an earlier poll: no turn of theirs has started since
        self.held, self.releasing = held & mine, held - mine
        if self.releasing:
            # hand back only partitions marked before `running` was taken and none of whose
            # origins is still being crawled here (a turn, or a crawl action not committed:
            # the next owner's todo list must see it)
            busy_parts = {self.part(o) for o in running}
            free = sorted((self.releasing & marked) - busy_parts)
            store.release(self.id, free)
            self.releasing = self.releasing - set(free)
        wanted = sorted(p for p in mine - held if p not in holders)
        if wanted:
            gained = dict(store.acquire(self.id, self.run, wanted, self.lease_seconds))
            if gained:
                log.info("leased partitions %s", sorted(gained))
                self.epochs = {**self.epochs, **gained}
                self.held = self.held | set(gained)


def plan_shares(workers: list[str], partitions: int, weights: dict[int, int],
                holders: dict[int, str]) -> dict[str, set[int]]:
    """Which partitions each worker should hold: shares of about equal work, where a
    partition weighs its configured origins (and an empty one a little, so that those are
    spread too). A partition stays with its live holder unless that takes the holder past the
    mean by more than half the partition; the others go, heaviest first, to the least loaded
    worker (ties: the first id). Every worker computes the same plan from the same rows.
    """
    weight = {p: weights.get(p, 0) + 1 / (partitions + 1) for p in range(partitions)}
    target = sum(weight.values()) / max(1, len(workers))
    load = dict.fromkeys(workers, 0.0)
    plan: dict[str, set[int]] = {w: set() for w in workers}
    order = sorted(weight, key=lambda p: (-weight[p], p))
    left = []
    for p in order:
        holder = holders.get(p)
        if holder in load and load[holder] + weight[p] / 2 <= target:
            load[holder] += weight[p]
            plan[holder].add(p)
        else:
            left.append(p)
    for p in left:
        least = min(workers, key=lambda w: (load[w], w))
        load[least] += weight[p]
        plan[least].add(p)
    return plan


def shared_settings(config: CrawlConfig) -> dict[str, Any]:
    """The configuration the fleet's workers should share, as flat `section.key` values."""
    flat: dict[str, Any] = {}
    for name, value in config.model_dump(mode="json").items():
        section = isinstance(getattr(config, name), BaseModel)
        for key, item in value.items() if section else [(name, value)]:
            dotted = f"{name}.{key}" if section else key
            if name not in OWN_SETTINGS and dotted not in OWN_SETTINGS:
                flat[dotted] = item
    return flat


def differences(mine: dict[str, Any], recorded: str) -> list[str]:
    """The shared settings on which another worker's (as recorded: JSON) differ from these,
    among those both know (another version of courtly may have other keys)."""
    try:
        theirs = json.loads(recorded)
    except ValueError:  # not courtly's writing: nothing to compare
        return []
    if not isinstance(theirs, dict):
        return []
    return [f"{key} {json.dumps(mine[key])} (theirs: {json.dumps(theirs[key])})"
            for key in sorted(mine.keys() & theirs.keys()) if mine[key] != theirs[key]]


def _under_way(crawl: Steering) -> list[str]:
    """The origins with a turn running or a crawl action not yet committed."""
    return [*crawl.turns.running(), *crawl.db.unwritten()]




def run_worker(
    store: PostgresStore,
    config: CrawlConfig,
    strategy: CrawlingStrategy,
    on_progress: Callable[[CrawlStats], None] | None = None,
    continuous: bool = False,
    run: Callable[[Crawler], Coroutine[Any, Any, CrawlStats]] | None = None,
) -> CrawlStats:
    """Run this process as one worker until the fleet is done, a signal, or the database is gone
    for longer than `fleet.reconnect_seconds` (the database thread reconnects until then)."""
    fleet = config.fleet
    polls = PostgresStore(store.url, fleet.reconnect_seconds)  # the fleet's own connection
    # a stopped or lost worker's open transaction holds its row locks this long at most
    idle = max(0.1, min(5.0, fleet.lease_seconds / 4))
    store.retry_seconds = fleet.reconnect_seconds
    for each in (store, polls):
        each.set_idle_timeout(idle)
    store.commit_lazily()  # the crawl's writes; leases and heartbeats are committed durably
    store.ensure_partitions(fleet.partitions)  # the crawl's rows name theirs
    worker = Worker(polls, fleet, continuous, shared_settings(config))
    store.worker = worker.id
    crawler = Crawler(config, store, strategy, on_progress=on_progress, fleet=worker)
    lost = False  # the database stayed away for reconnect_seconds
    try:
        stats = asyncio.run(run(crawler) if run is not None else crawler.run())
        lost = stats.stop is not None and stats.stop.kind is StopKind.CONNECTION_LOST
    except ConnectionLost:
        lost = True
        raise
    finally:
        if lost:  # one more try to give the leases back, not another reconnect_seconds
            polls.retry_seconds = 0
        try:
            worker.leave()
        except StoreError as exc:  # the database is gone: the leases will expire
            log.warning("could not give the leases back: %s", exc)
        polls.close()
    log.info("database: %d statements in %d round trips for %d crawl actions",
             store.statements, store.round_trips, stats.actions)
    return stats


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
        # a worker's id whole, however narrow the terminal: log lines name workers by it
        table.add_column(column, justify="left" if column in ("worker", "state") else "right",
                         no_wrap=column == "worker")
    for w in fleet["workers"]:
        table.add_row(w["worker"], w["state"], str(w["leases"]), str(w["actions"]),
                      f"{w['rate']:.2f}", f"{w['rate_last_minute']:.2f}",
                      f"{w['heartbeat_age']:.1f}s")
    console.print(table)
