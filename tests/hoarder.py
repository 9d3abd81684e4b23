"""A crawling strategy that takes every free file descriptor of the crawl process when the first
origin opens (after its robots.txt): `--strategy tests.hoarder:Hoarder`.

With `strategy_args = {release = true}` it gives them back as soon as the HTTP client says it is
short of resources, so a crawl can show that it waits and then carries on.
Kept in its own module so that the crawl process can import it by name.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from courtly.strategy import CrawlingStrategy, StrategyContext


class Hoarder(CrawlingStrategy):
    """Breadth-first, but the descriptors are gone from the first origin_opened on."""

    name = "hoarder"

    def __init__(
        self, context: StrategyContext | None = None, args: dict[str, Any] | None = None
    ) -> None:
        super().__init__(context, args)
        self.fds: list[int] = []

    def origin_opened(self, origin: str, sitemaps: list[str]) -> None:
        """Take every descriptor left (once)."""
        if self.fds:
            return
        try:
            while True:
                self.fds.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        if self.args.get("release"):
            logging.getLogger("courtly.fetch").addHandler(_Release(self))

    def give_back(self) -> None:
        """Close every descriptor taken."""
        for fd in self.fds:
            os.close(fd)
        self.fds = [-1]  # taken once: not again


class _Release(logging.Handler):
    def __init__(self, hoarder: Hoarder) -> None:
        super().__init__(logging.WARNING)
        self.hoarder = hoarder

    def emit(self, record: logging.LogRecord) -> None:
        if "short of resources" in record.getMessage() and self.hoarder.fds != [-1]:
            self.hoarder.give_back()
