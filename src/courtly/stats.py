"""A crawl's live counters, for the progress display, the summary, the fleet's heartbeat and
the live view (courtly.view): plain numbers the crawl bumps, read by whoever looks; and why it
stopped."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import Counter, deque
from dataclasses import dataclass, field
from enum import Enum, auto

from courtly.errors import ArchiveError, LocalError, describe
from courtly.model import CrawlAction
from courtly.store.base import ConnectionLost, StoreError

#: the upper bounds (seconds) of the response-time buckets of CrawlStats (Prometheus's `le`)
RESPONSE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LATEST_ERRORS = 50


class StopKind(Enum):
    """Why a crawl stopped."""

    FINISHED = auto()  # no origin has work left
    BUDGET = auto()  # --max-actions crawl actions were made
    GOAL = auto()  # the strategy's finished() said so
    SIGNAL = auto()  # SIGINT or SIGTERM
    DATABASE_ERROR = auto()
    CONNECTION_LOST = auto()  # to a shared database, for longer than fleet.reconnect_seconds
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
        if isinstance(exc, ArchiveError):
            return cls(StopKind.ARCHIVE_ERROR, str(exc))
        return cls(StopKind.INTERNAL_ERROR, f"internal error: {describe(exc)}")

    @property
    def failed(self) -> bool:
        """The crawl failed (exit status 1)."""
        return self.kind in FAILURES


@dataclass
class CrawlStats:
    """Live counters for progress display and the end-of-crawl summary."""

    started: float = field(default_factory=time.monotonic)
    actions: int = 0  # crawl actions recorded: the crawl log's rows
    budgeted: int = 0  # of them, those --max-actions counts (ORIGIN_GIVEN_UP: none)
    requests: int = 0
    errors: int = 0  # crawl actions whose exit code is an error (ExitCode.is_error)
    exit_codes: Counter[str] = field(default_factory=Counter)
    origins_total: int = 0
    origins_finished: int = 0
    in_flight: int = 0
    taken: int = 0  # URLs taken (--max-actions) whose action is not recorded yet
    stop: Stop | None = None
    #: origins finished for a reason other than having no work left: origin → the reason
    stopped_early: dict[str, str] = field(default_factory=dict)
    #: origins whose robots.txt asked a Crawl-delay above max_crawl_delay, obeyed at the cap
    clamped: dict[str, float] = field(default_factory=dict)
    clamped_to: float = 0.0  # that cap
    #: crawl actions, and errors (an exit code that leaves the candidate ERROR), by origin
    origin_actions: Counter[str] = field(default_factory=Counter)
    origin_errors: Counter[str] = field(default_factory=Counter)
    #: the latest errors, oldest first: (wall time, URL, origin, exit code, HTTP status, detail)
    latest_errors: deque[tuple[float, str, str, str, int | None, str]] = field(
        default_factory=lambda: deque(maxlen=LATEST_ERRORS)
    )
    #: responses of page requests: bytes of their bodies, their times by RESPONSE_BUCKETS (the
    #: last count: slower than them all) and the sum of their times
    response_bytes: int = 0
    response_times: list[int] = field(default_factory=lambda: [0] * (len(RESPONSE_BUCKETS) + 1))
    response_seconds: float = 0.0

    @property
    def rate(self) -> float:
        """Crawl actions per second since the start."""
        return self.actions / max(1e-9, time.monotonic() - self.started)

    @property
    def stop_reason(self) -> str:
        """Why the crawl stopped, in one line ("" while it runs)."""
        return "" if self.stop is None else self.stop.text

    def spent(self, budget: int, take: bool = False) -> Stop | None:
        """The stop of a crawl whose --max-actions `budget` is used up by the actions recorded
        and the URLs taken and not yet recorded (None: not spent, or no budget); `take`: a turn
        takes its next URL, one of the budget, when it is not. A turn still reading robots.txt
        takes none: it may never make an action."""
        if budget and self.budgeted + self.taken >= budget:
            return Stop(StopKind.BUDGET, f"budget of {budget} crawl actions spent")
        self.taken += take
        return None

    def recorded(self, action: CrawlAction, budgeted: bool = True) -> None:
        """Count a crawl action the store has recorded (budgeted: it counts in --max-actions)."""
        code = str(action.exit_code)
        self.actions += 1
        self.budgeted += budgeted
        self.taken -= budgeted and self.taken > 0
        self.exit_codes[code] += 1
        self.origin_actions[action.origin] += 1
        if action.exit_code.is_error:
            self.errors += 1
            self.origin_errors[action.origin] += 1
            self.latest_errors.append((action.started, action.candidate.url, action.origin, code,
                                       action.http_status, action.detail or ""))

    def responded(self, seconds: float, size: int) -> None:
        """Count a page's response: its time (request sent to body read) and body size."""
        self.response_bytes += size
        self.response_seconds += seconds
        self.response_times[bisect_left(RESPONSE_BUCKETS, seconds)] += 1
