"""The origins table of the view: one row per origin, its state in words, sorting."""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass
from typing import Any

#: origin states, in the order the page lists their counts
STATES = ("crawling", "ready", "waiting", "backing off", "finished", "idle")
SORT_KEYS = ("origin", "state", "actions", "errors", "delay", "robots", "reason")
#: rows sent for one request of the table (the page asks for one sorted page of it)
DEFAULT_LIMIT = 200
#: sorted pages kept per table (the page asks for one at a time; a client asking for many
#: limits must not grow a table that `courtly serve` of a finished crawl keeps for ever)
KEPT_PAGES = 32


@dataclass(slots=True)
class OriginView:
    """One origin as the page shows it (every text comes from the web: shown as text)."""

    origin: str
    #: crawling (a turn is running), ready (its time has come, waiting for a free slot of
    #: --concurrency), waiting (for its delay), backing off (429/503 or robots.txt
    #: unavailable), finished (reason says why); in a database without a live crawl: idle
    state: str
    reason: str
    actions: int
    errors: int
    delay: float | None  # seconds between two requests (from the database: the Crawl-delay)
    robots: str


def robots_status(status: int | None, error: str | None) -> str:
    """robots.txt in words: how the last fetch went and the rule it implies (RFC 9309)."""
    if error:
        return f"unavailable: {error}"
    if status is None:
        return "not fetched yet"
    if 200 <= status < 300:
        return f"{status}: rules apply"
    if 400 <= status < 500:
        return f"{status}: allow all"
    return f"{status}: disallow all"


class OriginTable:
    """The origins of one moment: their counts by state, and pages of them sorted by a column
    (each page computed once: the table is kept while its view keeps it)."""

    def __init__(self, rows: list[OriginView]) -> None:
        self.rows = rows
        self.states = dict.fromkeys(STATES, 0)
        for row in rows:
            self.states[row.state] = self.states.get(row.state, 0) + 1
        self._pages: dict[tuple[str, bool, int], dict[str, Any]] = {}

    def page(self, sort: str, descending: bool, limit: int) -> dict[str, Any]:
        """At most `limit` rows sorted by a column (unknown: by origin), as JSON."""
        # past the number of rows every limit is the same page
        key = (sort if sort in SORT_KEYS else "origin", descending,
               min(max(0, limit), len(self.rows)))
        found = self._pages.get(key)
        if found is None:
            if len(self._pages) >= KEPT_PAGES:
                del self._pages[next(iter(self._pages))]  # the oldest
            column = key[0]

            def value(row: OriginView) -> tuple[bool, Any]:
                v = getattr(row, column)
                return (v is not None, v if v is not None else 0)

            pick = heapq.nlargest if descending else heapq.nsmallest
            chosen = pick(key[2], self.rows, key=value)  # n log(limit), not a whole sort
            found = self._pages[key] = {
                "total": len(self.rows), "sort": column, "descending": descending,
                "states": self.states, "origins": [asdict(r) for r in chosen]}
        return found
