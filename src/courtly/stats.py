"""A crawl's live counters, for the progress display, the summary and the fleet's heartbeat."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field


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
    stop_reason: str = ""
    #: origins finished for a reason other than having no work left: origin → the reason
    stopped_early: dict[str, str] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Crawl actions per second since the start."""
        return self.actions / max(1e-9, time.monotonic() - self.started)
