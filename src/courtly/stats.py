"""A crawl's live counters, for the progress display, the summary and the fleet's heartbeat, and
why it stopped."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum, auto

from courtly.errors import LocalError, describe
from courtly.store.base import ConnectionLost, StoreError


class StopKind(Enum):
    """Why a crawl stopped."""

    FINISHED = auto()  # no origin has work left
    BUDGET = auto()  # --max-actions crawl actions were made
    GOAL = auto()  # the strategy's finished() said so
    SIGNAL = auto()  # SIGINT or SIGTERM
    DATABASE_ERROR = auto()
    CONNECTION_LOST = auto()  # to a shared database: a fleet worker joins the crawl again
    LOCAL_ERROR = auto()  # courtly's own machine ran out of something
    ARCHIVE_ERROR = auto()  # a WARC file could not be written (crawl --warc)
    INTERNAL_ERROR = auto()  # a bug in courtly or in the strategy


#: stop reasons after which the crawl's exit status is 1
FAILURES = frozenset({StopKind.DATABASE_ERROR, StopKind.CONNECTION_LOST, StopKind.LOCAL_ERROR,
                      StopKind.ARCHIVE_ERROR, StopKind.INTERNAL_ERROR})


@dataclass(frozen=True, slots=True)
class Stop:
    """Why a crawl stopped, and the one line the summary prints."""

    kind: StopKind
    text: str

    @classmethod
    def of(cls, exc: Exception) -> Stop:
        """The stop of a crawl that something raised in: a database error, a local error (out
        of descriptors, memory...: not the site's fault), else a bug, named with where it was
        raised."""
        if isinstance(exc, StoreError):
            lost = isinstance(exc, ConnectionLost)
            kind = StopKind.CONNECTION_LOST if lost else StopKind.DATABASE_ERROR
            return cls(kind, f"database error: {exc}")
        if isinstance(exc, LocalError):
            return cls(StopKind.LOCAL_ERROR, f"local error: {exc.detail}")
        return cls(StopKind.INTERNAL_ERROR, f"internal error: {describe(exc)}")

    @property
    def failed(self) -> bool:
        """The crawl failed (exit status 1)."""
        return self.kind in FAILURES


@dataclass
class CrawlStats:
    """Live counters for progress display and the end-of-crawl summary."""

    started: float = field(default_factory=time.monotonic)
    actions: int = 0
    requests: int = 0
    exit_codes: Counter[str] = field(default_factory=Counter)
    origins_total: int = 0
    origins_finished: int = 0
    in_flight: int = 0
    stop: Stop | None = None
    #: origins finished for a reason other than having no work left: origin → the reason
    stopped_early: dict[str, str] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Crawl actions per second since the start."""
        return self.actions / max(1e-9, time.monotonic() - self.started)

    @property
    def stop_reason(self) -> str:
        """Why the crawl stopped, in one line ("" while it runs)."""
        return "" if self.stop is None else self.stop.text
