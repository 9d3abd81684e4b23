"""The store interface and the per-origin state it persists."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from courtly.model import (
    Candidate,
    CrawlAction,
    Link,
    LinkState,
    OriginState,
    StoredPage,
    StoredRevisit,
)


class StoreError(Exception):
    """The crawl database failed (locked, full, corrupt, unreachable); one line for the user."""


class ConnectionLost(StoreError):
    """The connection to a shared crawl database was lost; `final` once reconnecting has been
    given up (the database stayed away past the limit)."""

    def __init__(self, message: str, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


@dataclass(slots=True)
class Write:
    """A queued write: a crawl action, or an origin's state, or links or origins found, with the
    lease it is made under as (partition, epoch) (None: not fenced)."""

    action: CrawlAction | None = None
    run: int = 0
    lease: tuple[int, int] | None = None
    state: OriginState | None = None
    links: list[Link] | None = None
    origins: list[str] | None = None


class Store(Protocol):
    """What the crawler needs from the crawl database. Only the store writes it."""

    #: group commit window in seconds (0: each crawl action commits at once)
    commit_interval: float
    #: many workers share the database (PostgreSQL): a crawl runs as one worker of the fleet
    shared: bool

    def add_links(self, links: list[Link]) -> int:
        """Insert candidates (known URLs are a no-op, a higher score wins); returns rows added."""
        ...

    def add_origins(self, origins: list[str], seed: bool = False) -> None:
        """Make origins configured (crawled) origins; seed: they are seeds' origins."""
        ...

    def add_seeds(self, links: list[Link], metadata: dict[str, dict[str, Any]]) -> int:
        """The seeds as the strategy scheduled them (their origins configured, as seeds'
        origins) and the domain metadata it saved, in one transaction; returns rows added."""
        ...

    def seed_origins(self) -> list[str]:
        """The origins of the seeds (their hosts pass the address guard)."""
        ...

    def configured_origins(self) -> list[str]:
        """The origins this crawl crawls."""
        ...

    def begin_run(self) -> int:
        """Resume the unfinished run, or start a new one; returns its id. Resumed after a
        process that did not stop cleanly (kill -9), every origin counts as asked just now."""
        ...

    def make_due(self, run: int, now: float) -> None:
        """Every crawled candidate due by `now` (--force-recrawl), kept so: a resumed run
        without the flag recrawls what a stopped one left. Not those `run` has crawled: a
        worker joining the run, or a forced resume, does not undo their new due times."""
        ...

    def end_run(self, run: int, last_requests: dict[str, float], finished: bool) -> None:
        """The run's process stopped cleanly: when each origin was last asked (wall clock),
        and, `finished`, the run is over: the next invocation starts a new one."""
        ...

    def take_todo(self, origin: str, run: int, limit: int, now: float) -> list[Candidate]:
        """Candidates to retry, new ones best score first, then due ones not crawled this run.

        Read only: the caller takes again only after recording all it took before.
        """
        ...

    def record(self, action: CrawlAction, run: int) -> None:
        """Write one crawl action's results in one transaction."""
        ...

    def load_origin(self, origin: str) -> OriginState:
        """The persisted state of an origin (empty if unknown)."""
        ...

    def save_origin(self, state: OriginState) -> None:
        """Persist an origin's state."""
        ...

    def find_hash(self, content_hash: str, url: str) -> str | None:
        """Another URL whose stored content has this fingerprint, if any."""
        ...

    def redirect_chain(self, url: str, limit: int) -> int:
        """How many recorded redirects lead to url, counted back up to limit + 1."""
        ...

    def find_similar(
        self, signature: bytes, url: str, min_similarity: float
    ) -> tuple[str, float] | None:
        """Another OK page whose text is this similar (courtly.dedup): (its URL, similarity).

        Found through the LSH band keys (one indexed query), never by a table scan.
        """
        ...

    def states(self, urls: list[str]) -> dict[str, LinkState]:
        """The link states of the known URLs among these (unknown URLs are absent)."""
        ...

    def page_lookups(
        self, content_hash: str | None, signature: bytes | None, url: str,
        min_similarity: float, links: list[str] | None, score: float, own: int | None = None,
    ) -> tuple[str | None, tuple[str, float] | None, list[str] | None, float | None]:
        """find_hash (if content_hash), else find_similar (if signature), unsettled (if links),
        and the similarity of `signature` to candidate `own`'s stored one (if own: a recrawled
        page's last version; None when it has none), at once (PostgreSQL: one round trip)."""
        ...

    def unsettled(self, urls: list[str], score: float) -> list[str]:
        """The URLs (in order) whose candidate a link with this score would add, or whose score
        it would raise: never crawled, and not already known with at least this score."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counts by link state, exit code and origin."""
        ...

    def export(self) -> Iterator[dict[str, Any]]:
        """One record per crawl candidate."""
        ...

    def stored_pages(self) -> Iterator[StoredPage]:
        """The page bodies kept in the content table, in URL order."""
        ...

    def stored_revisits(self) -> Iterator[StoredRevisit]:
        """The revisits (304s, exact duplicates) of pages still kept, by URL and time."""
        ...

    def revisit(self, url: str, fetched: float) -> StoredRevisit | None:
        """The revisit recorded for this URL at this time, if its page is still kept."""
        ...

    def candidate(self, url: str) -> dict[str, Any] | None:
        """One candidate's record, if known."""
        ...

    def flush(self, age: float = 0.0) -> None:
        """Commit writes held back by group commit (those held at least `age` seconds)."""
        ...

    def stop_reconnecting(self) -> None:
        """Stop waiting for a lost database server (a second signal): what is not written yet
        is lost, and crawled again by the next run (SQLite: nothing to wait for)."""
        ...

    def close(self) -> None:
        """Close the connection."""
        ...
