"""The crawling strategy API (Frontera's) and the built-in strategies."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from courtly.model import LinkState


@dataclass(slots=True)
class Request:
    """A URL the strategy reasons about (Frontera's Request)."""

    url: str
    depth: int = 0
    score: float = 1.0
    meta: dict[str, Any] = field(default_factory=dict)
    state: LinkState | None = None


@dataclass(slots=True)
class Response:
    """A crawled page as the strategy sees it (Frontera's Response)."""

    request: Request
    status: int | None
    exit_code: str
    headers: dict[str, str]
    body: bytes
    title: str | None = None


@dataclass(slots=True)
class Scheduled:
    """A request the strategy scheduled, with its score."""

    request: Request
    score: float
    dont_queue: bool


class StateLookup:
    """Reads link states for refresh_states; the crawler provides one backed by the store."""

    def states(self, urls: list[str]) -> dict[str, LinkState]:
        """Known states by URL (unknown URLs are absent)."""
        return {}


class CrawlingStrategy:
    """Base class: override the event handlers; call schedule() to queue URLs with a score."""

    name = "base"

    def __init__(self, states: StateLookup | None = None) -> None:
        self._states = states or StateLookup()
        self.scheduled: list[Scheduled] = []

    # -- events (Frontera names) ---------------------------------------------------------
    def read_seeds(self, stream: TextIO) -> None:
        """Schedule one request per non-empty, non-comment line."""
        for line in stream:
            url = line.strip()
            if url and not url.startswith("#"):
                self.schedule(self.create_request(url), score=1.0)

    def page_crawled(self, response: Response) -> None:
        """A page was crawled successfully."""

    def filter_extracted_links(self, request: Request, links: list[Request]) -> list[Request]:
        """Keep only the links links_extracted needs (all by default)."""
        return links

    def links_extracted(self, request: Request, links: list[Request]) -> None:
        """Schedule the extracted links (breadth-first by default)."""
        for link in links:
            self.schedule(link, score=1.0 / (1 + link.depth))

    def request_error(self, request: Request, error: str) -> None:
        """A crawl action ended in an error (the exit code name)."""

    def finished(self) -> bool:
        """True once the crawl's goal is reached: the crawl stops."""
        return False

    def close(self) -> None:
        """The crawl is ending."""

    # -- helpers -------------------------------------------------------------------------
    def schedule(self, request: Request, score: float = 1.0, dont_queue: bool = False) -> None:
        """Queue a request with a score in [0, 1] (dont_queue: update the score only)."""
        self.scheduled.append(Scheduled(request, max(0.0, min(1.0, score)), dont_queue))

    def create_request(
        self, url: str, depth: int = 0, meta: dict[str, Any] | None = None
    ) -> Request:
        """A new request (its state is unknown until refresh_states)."""
        return Request(url, depth, meta=dict(meta or {}))

    def refresh_states(self, requests: Iterable[Request]) -> None:
        """Fill request.state from the crawl database."""
        batch = list(requests)
        known = self._states.states([r.url for r in batch])
        for r in batch:
            r.state = known.get(r.url, LinkState.NOT_CRAWLED)

    def take_scheduled(self) -> list[Scheduled]:
        """Hand the scheduled requests to the crawler (and forget them)."""
        out, self.scheduled = self.scheduled, []
        return out


class BreadthFirst(CrawlingStrategy):
    """Shallow pages first (the default)."""

    name = "breadth-first"


class DepthFirst(CrawlingStrategy):
    """Deep pages first."""

    name = "depth-first"

    def links_extracted(self, request: Request, links: list[Request]) -> None:
        """Deeper links get higher scores."""
        for link in links:
            self.schedule(link, score=1.0 - 1.0 / (2 + link.depth))


BUILTIN: dict[str, type[CrawlingStrategy]] = {
    cls.name: cls for cls in (BreadthFirst, DepthFirst)
}


class StrategyError(Exception):
    """The strategy named by the user cannot be loaded."""


def load_strategy(spec: str, states: StateLookup | None = None) -> CrawlingStrategy:
    """A built-in name, or 'module:Class' naming a CrawlingStrategy subclass."""
    if spec in BUILTIN:
        return BUILTIN[spec](states)
    module_name, _, class_name = spec.partition(":")
    if not class_name:
        names = ", ".join(sorted(BUILTIN))
        raise StrategyError(f"unknown strategy {spec!r} (built-in: {names}; or module:Class)")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise StrategyError(f"cannot load strategy {spec!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, CrawlingStrategy)):
        raise StrategyError(f"{spec!r} is not a courtly.strategy.CrawlingStrategy subclass")
    return cls(states)
