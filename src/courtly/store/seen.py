"""The seen cache: the link states of recently seen URLs, in front of the crawl database.

Most links on a page are already known, so asking the database for each one's state (for the
strategy) and upserting it again (a no-op) was a sixth of the crawl process's time. The store keeps
what it read and wrote about the most recent URLs and answers those from memory; an upsert that
the database would ignore (`Store.add_links`: only a NOT_CRAWLED candidate's score may rise) is
not sent. Bounded and keyed by the URL string's own 64-bit hash (Python computes it once per
string and keeps it: the same link string is looked up, then recorded), so memory stays flat
however large the frontier. Two URLs sharing a key in a cache of SIZE entries: about one chance in
10**14 per lookup.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from courtly.model import Link, LinkState

#: entries kept (about 90 bytes each; up to an eighth more until the oldest eighth goes)
SIZE = 1 << 17
_ABSENT = -1.0  # asked for and not in the database: the next upsert inserts it


class SeenCache:
    """URL → LinkState, or the score while NOT_CRAWLED (a float), for the most recent URLs.

    Correct for one writer (the crawl process; with several workers a stale entry only makes the
    strategy schedule a URL another worker took, which the upsert then ignores).
    """

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._entries: dict[int, LinkState | float] = {}

    def known(self, urls: Iterable[str]) -> tuple[dict[str, LinkState], list[str]]:
        """The states the cache knows (a URL known to be absent from the database is left out)
        and the URLs it does not know. (Read only: the event loop may call it while the database
        thread writes the cache, each look-up one dict.get.)"""
        states: dict[str, LinkState] = {}
        unknown: list[str] = []
        entries = self._entries
        for url in urls:
            entry = entries.get(hash(url))
            if entry is None:
                unknown.append(url)
            elif not isinstance(entry, float):
                states[url] = entry
            elif entry != _ABSENT:
                states[url] = LinkState.NOT_CRAWLED
        return states, unknown

    def put(self, url: str, state: LinkState, score: float = 0.0) -> None:
        """Remember url's state as the database now has it."""
        self._set(hash(url), float(score) if state is LinkState.NOT_CRAWLED else state)

    def absent(self, url: str) -> None:
        """url was looked up and is not in the database."""
        self._set(hash(url), _ABSENT)

    def changing(self, urls: Iterable[str], score: float) -> tuple[list[str], list[str]]:
        """The URLs whose upsert with this score could change the database: new_links' test,
        without recording anything (unknown here, absent, or never crawled with a lower score);
        and those of them the cache does not know."""
        entries = self._entries
        out = []
        unknown = []
        for url in urls:
            entry = entries.get(hash(url))
            if entry is None:
                out.append(url)
                unknown.append(url)
            elif isinstance(entry, float) and score > entry:
                out.append(url)
        return out, unknown

    def new_links(self, links: Iterable[Link]) -> list[Link]:
        """The links whose upsert could change the database; the cache records the result."""
        out = []
        for link in links:
            key = hash(link.url)
            entry = self._entries.get(key)
            if entry is None:
                out.append(link)  # unknown here: its state after the upsert is unknown too
            elif isinstance(entry, float) and link.score > entry:
                out.append(link)
                self._entries[key] = float(link.score)  # inserted (was absent) or raised
        return out

    def _set(self, key: int, value: LinkState | float) -> None:
        entries = self._entries
        entries.pop(key, None)  # re-inserted: the newest
        entries[key] = value
        if len(entries) > self.size + self.size // 8:
            # the oldest eighth goes at once, into a compact dict: deleting the first entry one
            # at a time leaves holes that every next(iter()) walks (0.5 ms a put at 500k URLs)
            self._entries = dict(itertools.islice(entries.items(), len(entries) - self.size,
                                                  None))

    def clear(self) -> None:
        """Forget everything (after a failed write the database may disagree)."""
        self._entries.clear()
