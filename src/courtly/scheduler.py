"""Origin crawlers and the penalty box: who may send the next request, and when."""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

from courtly.config import Politeness
from courtly.model import Candidate
from courtly.policy import ShapeBudget
from courtly.robots import RobotsRules
from courtly.store import OriginState


@dataclass
class OriginCrawler:
    """The per-origin crawl loop's state: robots.txt, todo list, delay, patience."""

    origin: str
    state: OriginState
    patience: int
    robots: RobotsRules | None = None
    robots_expires: float = 0.0  # monotonic time at which robots.txt must be fetched again
    todo: deque[Candidate] = field(default_factory=deque)
    next_request_at: float = 0.0  # monotonic: no request to this origin before then
    response_times: deque[float] = field(default_factory=lambda: deque(maxlen=5))
    last_rate_limited: float = 0.0
    pages_this_run: int = 0
    shapes: ShapeBudget = field(default_factory=lambda: ShapeBudget(0))  # crawl actions by shape
    finished: bool = False
    finish_reason: str = ""


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
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, float(when.timestamp()) - now_wall)


def rate_limit_pause(
    crawler: OriginCrawler, retry_after: float | None, rules: Politeness, now: float
) -> float:
    """Seconds to stay away after a 429/503: Retry-After (capped) or exponential backoff."""
    if now - crawler.last_rate_limited > rules.backoff_forgive_after:
        crawler.state.backoff_level = 0  # forgiven after a quiet period
    crawler.last_rate_limited = now
    crawler.state.backoff_level += 1
    if retry_after is not None:
        return min(retry_after, rules.retry_after_cap)
    base = rules.backoff_base * 2.0 ** (crawler.state.backoff_level - 1)
    return min(rules.backoff_max, base * random.uniform(1.0, 1.5))
