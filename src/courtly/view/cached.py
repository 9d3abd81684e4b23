"""A database query's answer kept for a while: the longer the query took, the longer it is kept."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Generic, TypeVar

T = TypeVar("T")


class Cached(Generic[T]):
    """The result of `fetch` (run in `executor`), fetched again at most every `every` seconds
    and never more often than `factor` times its own duration: a query over a large table
    costs the database at most 1/factor of its time however often the page refreshes."""

    def __init__(self, fetch: Callable[[], T], executor: Executor, every: float = 2.0,
                 factor: float = 20.0) -> None:
        self._fetch, self._executor = fetch, executor
        self.every, self.factor = every, factor
        self._value: T | None = None
        self.version = 0  # how many times it was fetched
        self._at = -float("inf")
        self._took = 0.0
        self._lock = asyncio.Lock()

    @property
    def value(self) -> T | None:
        """The last answer (None before the first)."""
        return self._value

    async def get(self) -> T:
        """The answer, fetched again if it is old enough."""
        async with self._lock:
            if self._value is None or time.monotonic() - self._at >= max(
                self.every, self.factor * self._took
            ):
                began = time.monotonic()
                loop = asyncio.get_running_loop()
                self._value = await loop.run_in_executor(self._executor, self._fetch)
                self._at = time.monotonic()
                self._took = self._at - began
                self.version += 1
            return self._value
