"""A user strategy loaded by `--strategy tests.test_strategy_user:Topical` (the docs' example).

Kept in its own module so that it can be imported by name, as a user's own module would be.
"""

from __future__ import annotations

from typing import Any, TextIO

from courtly.model import LinkState
from courtly.strategy import CrawlingStrategy, Request, Response, StrategyContext
from courtly.urls import origin_of


class Topical(CrawlingStrategy):
    """Crawl the pages whose links' anchor text mentions a keyword first; stop after N of them."""

    name = "topical"
    todo_batch = 1  # obey the scores page by page

    def __init__(
        self, context: StrategyContext | None = None, args: dict[str, Any] | None = None
    ) -> None:
        super().__init__(context, args)
        self.keywords = [k.lower() for k in self.args.get("keywords", ["python"])]
        self.goal = int(self.args.get("goal", 0))  # 0: no goal
        self.relevant = 0

    def read_seeds(self, stream: TextIO) -> None:
        """Seeds the database already knows are not scheduled again."""
        requests = [self.create_request(line.strip()) for line in stream if line.strip()]
        self.refresh_states(requests)
        for request in requests:
            if request.state is LinkState.NOT_CRAWLED:
                self.schedule(request, score=1.0)
                meta = self.domain_metadata[origin_of(request.url)]
                meta["seeded"] = meta.get("seeded", 0) + 1

    def page_crawled(self, response: Response) -> None:
        """Count pages per origin (persisted) and relevant pages (this run)."""
        meta = self.domain_metadata[origin_of(response.request.url)]
        meta["pages"] = meta.get("pages", 0) + 1
        if response.request.depth > 0 and response.request.score >= 0.9:
            self.relevant += 1

    def filter_extracted_links(self, request: Request, links: list[Request]) -> list[Request]:
        """Links marked 'skip' are never looked at."""
        return [link for link in links if "skip" not in link.meta.get("anchor", "").lower()]

    def links_extracted(self, request: Request, links: list[Request]) -> None:
        """On-topic anchors score 0.9, the rest 0.1."""
        for link in links:
            if link.state is not LinkState.NOT_CRAWLED:
                continue
            anchor = link.meta.get("anchor", "").lower()
            on_topic = any(k in anchor for k in self.keywords)
            self.schedule(link, score=0.9 if on_topic else 0.1)

    def finished(self) -> bool:
        """The goal: that many on-topic pages crawled."""
        return bool(self.goal) and self.relevant >= self.goal


class GenericBreadthFirst(CrawlingStrategy):
    """Breadth-first through the per-link handlers (the crawler's direct path is then off)."""

    def links_extracted(self, request: Request, links: list[Request]) -> None:
        """The base class's own rule, overridden only to take the per-link path."""
        super().links_extracted(request, links)


class ExtraFromPageCrawled(CrawlingStrategy):
    """Base link handlers (the direct path) plus a URL scheduled from page_crawled."""

    def page_crawled(self, response: Response) -> None:
        """Schedule /extra from the first page."""
        if response.request.url.endswith("/"):
            self.schedule(self.create_request(response.request.url + "extra", 1), 0.2)


class RaisesOnOnePage(CrawlingStrategy):
    """A strategy with a bug: page_crawled raises on /boom."""

    def page_crawled(self, response: Response) -> None:
        """Fail on one page."""
        if response.request.url.endswith("/boom"):
            raise ValueError("no boom allowed")


class RaisesWhenAskedIfFinished(CrawlingStrategy):
    """A strategy with a bug outside a page's handling: finished() raises."""

    def finished(self) -> bool:
        """Fail after the first crawl action."""
        raise RuntimeError("cannot tell")
