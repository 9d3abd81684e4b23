"""The view of a crawl database (`courtly serve`): its crawl log followed as it grows."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from courtly.model import ERRORS
from courtly.store.reader import OriginRow, Reader
from courtly.view.cached import Cached
from courtly.view.origins import OriginTable, OriginView, robots_status
from courtly.view.tally import Tally

#: log rows read by one query; the log is read again this often when it had no more
CHUNK = 5000
POLL = 1.0
#: an origin with an action this recent is shown crawling
ACTIVE_FOR = 10.0


class DbView:
    """A crawl database read through its own read-only connection, on one thread of its own."""

    source = "database"

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.tally = Tally()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="courtly-view")
        self._origins = Cached(reader.origins, self.executor)
        self._states = Cached(reader.candidates_by_state, self.executor)
        self._fleet = Cached(reader.fleet, self.executor)
        self._run = Cached(reader.last_run, self.executor)
        self._table = OriginTable([])
        self._table_version: tuple[int, Any, int] | None = None
        self.caught_up = False  # the whole log has been read once
        self.failure = ""  # why the log could not be read (shown on the page)

    async def read_log(self) -> bool:
        """Read the next rows of the crawl log; True when there were as many as a chunk."""
        loop = asyncio.get_running_loop()
        gaps = sorted(self.tally.gaps)[:500]
        after = self.tally.last_id
        rows = await loop.run_in_executor(
            self.executor, self.reader.log_after, after, CHUNK, gaps)
        self.tally.add(rows, time.time(), track_gaps=self.reader.shared)
        return sum(1 for r in rows if r.id > after) >= CHUNK

    async def run(self) -> None:
        """Follow the crawl log for as long as the server runs."""
        from courtly.store import StoreError

        while True:
            try:
                more = await self.read_log()
                self.failure = ""
            except StoreError as exc:
                self.failure, more = str(exc), False
            self.caught_up = self.caught_up or not more
            if not more:
                await asyncio.sleep(POLL)

    def close(self) -> None:
        """Stop the database thread and close the connection."""
        self.executor.submit(self.reader.close)
        self.executor.shutdown(wait=True)

    async def summary(self) -> dict[str, Any]:
        """Totals and rates of the crawl log."""
        tally, now = self.tally, time.time()
        rates = tally.series.rate(now) if tally.series else (0.0, 0.0)
        run = await self._run.get()
        states = await self._states.get()
        origins = await self.origins()
        by_state = {state: n for state, n in origins.states.items() if n}
        return {
            "source": self.source, "db": self.reader.where, "worker": None, "now": now,
            "started": tally.first, "latest": tally.last, "actions": tally.rows,
            "requests": tally.requests, "errors": tally.errors, "bytes": tally.bytes,
            "in_flight": None, "rate": {"actions": rates[0], "requests": rates[1]},
            "exit_codes": dict(tally.exit_codes.most_common()),
            "origins": {"total": len(origins.rows), **by_state},
            "candidates": states, "run": None if run is None else {
                "id": run[0], "started": run[1], "finished": run[2]},
            "stop_reason": "", "error_codes": sorted(ERRORS), "reading": not self.caught_up,
            "failure": self.failure,
        }

    def series(self) -> dict[str, Any]:
        """Crawl actions and requests over time (requests: actions that sent one; robots.txt
        requests are not in the log)."""
        if self.tally.series is None:
            return {"start": time.time(), "step": 1.0, "actions": [], "requests": []}
        return self.tally.series.data()

    async def origins(self) -> OriginTable:
        """Every origin of the crawl, the configured ones and those in the log (built again with
        the origins table's query, or when the log has grown)."""
        known = await self._origins.get()
        run = await self._run.get()
        version = (self._origins.version, run, self.tally.rows)
        if version != self._table_version:
            by_name = {row.origin: row for row in known}
            names = {o for o, row in by_name.items() if row.configured} | set(self.tally.origins)
            now = time.time()
            self._table = OriginTable([self._row(n, by_name.get(n), now, run) for n in names])
            self._table_version = version
        return self._table

    def _row(self, name: str, row: OriginRow | None, now: float,
             run: tuple[int, float, float | None] | None) -> OriginView:
        """An origin's state from the database: finished (its run finished, or in a fleet it
        was given up for the run), backing off (until its backoff time), crawling (an action
        in the last ACTIVE_FOR seconds) or idle."""
        counted = self.tally.origins.get(name)
        actions, errors = (counted.actions, counted.errors) if counted else (0, 0)
        last = counted.last if counted else 0.0
        if row is not None and run is not None and row.finished_run == run[0]:
            state, reason = "finished", "given up for this run"
        elif run is not None and run[2] is not None:
            state, reason = "finished", "the run finished"
        elif row is not None and row.backoff_until > now:
            until = time.strftime("%H:%M:%S", time.localtime(row.backoff_until))
            state, reason = "backing off", f"until {until}"
        elif now - last < ACTIVE_FOR:
            state, reason = "crawling", ""
        else:
            state, reason = "idle", ""
        robots = robots_status(row.robots_status, row.robots_error) if row else "not fetched yet"
        return OriginView(name, state, reason, actions, errors,
                          row.crawl_delay if row else None, robots)

    def errors(self) -> list[dict[str, Any]]:
        """The latest errors, newest first."""
        return list(reversed(self.tally.latest_errors))

    async def workers(self) -> dict[str, Any]:
        """The fleet's workers with their leases and rates."""
        return await self._fleet.get()
