"""Counts over time in a bounded number of bins: the rate chart's data."""

from __future__ import annotations

import math
from typing import Any

#: at most this many bins: past them, neighbouring bins merge and the step doubles
MAX_BINS = 600


class Series:
    """Crawl actions and requests per time bin, from `start` in bins of `step` seconds.

    Memory is bounded whatever the crawl's length: when a count falls past the last bin, bins
    merge in pairs (the step doubles), so a day's crawl keeps 600 bins of about 2.4 minutes.
    """

    def __init__(self, start: float, step: float = 1.0) -> None:
        self.start = math.floor(start)
        self.step = step
        self.actions: list[int] = []
        self.requests: list[int] = []

    def add(self, at: float, actions: int, requests: int) -> None:
        """Count actions and requests at wall time `at` (before the start: the first bin)."""
        index = max(0, int((at - self.start) // self.step))
        while index >= MAX_BINS:
            self._halve()
            index = max(0, int((at - self.start) // self.step))
        if index >= len(self.actions):
            grow = index + 1 - len(self.actions)
            self.actions.extend([0] * grow)
            self.requests.extend([0] * grow)
        self.actions[index] += actions
        self.requests[index] += requests

    def _halve(self) -> None:
        self.step *= 2
        self.actions = _pairs(self.actions)
        self.requests = _pairs(self.requests)

    def rate(self, now: float, window: float = 10.0) -> tuple[float, float]:
        """(actions, requests) per second over about the last `window` seconds before `now`."""
        first = max(0, int((now - window - self.start) // self.step))
        since = max(self.start + first * self.step, self.start)
        span = max(now - since, 1e-9)
        return sum(self.actions[first:]) / span, sum(self.requests[first:]) / span

    def data(self) -> dict[str, Any]:
        """The bins as JSON: counts per bin of `step` seconds from `start` (wall time)."""
        return {"start": self.start, "step": self.step, "actions": list(self.actions),
                "requests": list(self.requests)}


def _pairs(counts: list[int]) -> list[int]:
    return [sum(counts[i:i + 2]) for i in range(0, len(counts), 2)]
