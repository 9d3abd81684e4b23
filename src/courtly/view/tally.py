"""The crawl log summed up: exit codes, time per action, rate over time, origins, errors.

Fed the log's rows in id order (`add`), possibly while the crawl writes more; its memory is
bounded by the number of origins (plus fixed-size histogram, bins and error list).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from courtly.model import ERRORS, ExitCode
from courtly.stats import LATEST_ERRORS, RESPONSE_BUCKETS
from courtly.store.reader import LogRow
from courtly.view.series import Series

#: exit codes of crawl actions that sent no request
NO_REQUEST = frozenset({str(ExitCode.BLOCKED_BY_ROBOTS_TXT), str(ExitCode.BLOCKED_BY_TRAP_BUDGET),
                        str(ExitCode.BLOCKED_URL_BY_LOCAL_POLICY), str(ExitCode.BLOCKED_ADDRESS),
                        str(ExitCode.ORIGIN_GIVEN_UP)})
#: a missing id below the last one read is looked for again this long (PostgreSQL commits
#: rows of concurrent workers out of id order)
GAP_SECONDS = 60.0
MAX_GAPS = 5000


@dataclass(slots=True)
class OriginTally:
    """One origin's crawl actions in the log."""

    actions: int = 0
    errors: int = 0
    requests: int = 0
    elapsed: float = 0.0  # sum over the actions that sent a request
    slowest: float = 0.0
    last: float = 0.0  # wall time of its latest action


class Tally:
    """Sums of the crawl log's rows read so far."""

    def __init__(self) -> None:
        self.rows = 0
        self.last_id = 0
        self.exit_codes: Counter[str] = Counter()
        self.errors = 0
        self.requests = 0
        self.bytes = 0
        #: crawl actions that sent a request, by their elapsed time (RESPONSE_BUCKETS)
        self.elapsed = [0] * (len(RESPONSE_BUCKETS) + 1)
        self.elapsed_sum = 0.0
        self.origins: dict[str, OriginTally] = {}
        self.latest_errors: deque[dict[str, Any]] = deque(maxlen=LATEST_ERRORS)
        self.series: Series | None = None
        self.first: float | None = None
        self.last: float | None = None
        #: ids missing below last_id, with when they were noticed
        self.gaps: dict[int, float] = {}

    def add(self, rows: list[LogRow], now: float, track_gaps: bool = False) -> None:
        """Count rows (in id order; rows of earlier gaps may come first)."""
        for row in rows:
            if row.id <= self.last_id:
                if self.gaps.pop(row.id, None) is None:
                    continue  # counted already
            else:
                if track_gaps and row.id > self.last_id + 1 and self.last_id:
                    for missing in range(self.last_id + 1, min(row.id, self.last_id + MAX_GAPS)):
                        self.gaps[missing] = now
                self.last_id = row.id
            self._count(row)
        for missing, since in list(self.gaps.items()):
            if now - since > GAP_SECONDS or len(self.gaps) > MAX_GAPS:
                del self.gaps[missing]

    def _count(self, row: LogRow) -> None:
        self.rows += 1
        code = row.exit_code
        self.exit_codes[code] += 1
        origin = self.origins.get(row.origin)
        if origin is None:
            origin = self.origins[row.origin] = OriginTally()
        origin.actions += 1
        origin.last = max(origin.last, row.started)
        requested = code not in NO_REQUEST
        if requested:
            self.requests += 1
            origin.requests += 1
            origin.elapsed += row.elapsed
            origin.slowest = max(origin.slowest, row.elapsed)
            self.elapsed_sum += row.elapsed
            self.elapsed[bisect_left(RESPONSE_BUCKETS, row.elapsed)] += 1
        self.bytes += row.content_length or 0
        if code in ERRORS:
            self.errors += 1
            origin.errors += 1
            self.latest_errors.append({
                "time": row.started, "url": row.url or "", "origin": row.origin,
                "exit_code": code, "http_status": row.http_status, "detail": row.detail or "",
            })
        if self.series is None:
            self.series = Series(row.started)
        self.series.add(row.started, 1, int(requested))
        self.first = row.started if self.first is None else min(self.first, row.started)
        self.last = row.started if self.last is None else max(self.last, row.started)

    def slowest_origins(self, limit: int = 15) -> list[dict[str, Any]]:
        """The origins with the longest mean time per request."""
        ranked = sorted(((o.elapsed / o.requests, name, o) for name, o in self.origins.items()
                         if o.requests), key=lambda t: t[0], reverse=True)[:limit]
        return [{"origin": name, "mean": round(mean, 4), "slowest": round(o.slowest, 4),
                 "requests": o.requests} for mean, name, o in ranked]

    def failing_origins(self, limit: int = 15) -> list[dict[str, Any]]:
        """The origins with the most errors."""
        ranked = sorted(((o.errors, name, o) for name, o in self.origins.items() if o.errors),
                        key=lambda t: t[0], reverse=True)[:limit]
        return [{"origin": name, "errors": errors, "actions": o.actions,
                 "share": round(errors / o.actions, 3)} for errors, name, o in ranked]
