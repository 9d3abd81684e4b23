"""A user strategy loaded by `--strategy tests.test_strategy_user:Topical` (the docs' example).

Kept in its own module so that it can be imported by name, as a user's own module would be.
"""

from __future__ import annotations

import os
import signal
import threading
import time
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
        """Seeds the database already crawled are not scheduled again."""
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


class InitLikeFrontera(CrawlingStrategy):
    """Frontera's constructor signature, not courtly's."""

    def __init__(self, manager: Any, args: Any, scheduled_stream: Any, states_context: Any
                 ) -> None:
        super().__init__(None, args)


class NoSuperInit(CrawlingStrategy):
    """An __init__ that forgets super().__init__."""

    def __init__(self, context: StrategyContext | None = None,
                 args: dict[str, Any] | None = None) -> None:
        self.seen = 0


class SchedulesNothing(CrawlingStrategy):
    """read_seeds schedules none of the seeds."""

    def read_seeds(self, stream: TextIO) -> None:
        """Ignore them."""


class SchedulesAString(CrawlingStrategy):
    """schedule() given a URL, not a Request."""

    def links_extracted(self, request: Request, links: list[Request]) -> None:
        """The mistake."""
        for link in links:
            self.schedule(link.url, 0.5)  # type: ignore[arg-type]


class SchedulesNoScore(CrawlingStrategy):
    """schedule() given a score that is no number."""

    def links_extracted(self, request: Request, links: list[Request]) -> None:
        """The mistake."""
        for link in links:
            self.schedule(link, None)  # type: ignore[arg-type]


class FiltersToNone(CrawlingStrategy):
    """filter_extracted_links that forgets to return."""

    def filter_extracted_links(self, request: Request, links: list[Request]) -> list[Request]:
        """The mistake."""
        return None  # type: ignore[return-value]


class FailsOnErrors(CrawlingStrategy):
    """request_error raises."""

    def request_error(self, request: Request, error: str) -> None:
        """The bug."""
        raise ValueError(f"cannot handle {error}")


class KeepsASet(CrawlingStrategy):
    """Domain metadata that JSON cannot hold."""

    def page_crawled(self, response: Response) -> None:
        """The mistake."""
        self.domain_metadata[origin_of(response.request.url)]["seen"] = {response.request.url}


class SchedulesFromAThread(CrawlingStrategy):
    """Calls schedule() from a thread of its own; keeps what that raised in the metadata."""

    def page_crawled(self, response: Response) -> None:
        """Schedule /from-thread from another thread."""
        errors: list[str] = []

        def work() -> None:
            try:
                self.schedule(self.create_request(response.url + "from-thread", 1), 1.0)
            except RuntimeError as exc:
                errors.append(str(exc))

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        self.domain_metadata[origin_of(response.url)]["thread"] = errors


class FronteraStyle(CrawlingStrategy):
    """Frontera's documented calls: refresh_states(one request), response.url and .meta."""

    def read_seeds(self, stream: TextIO) -> None:
        """As Frontera's BreadthFirstCrawlingStrategy does."""
        for line in stream:
            req = self.create_request(line.strip(), meta={b"depth": 0})
            self.refresh_states(req)
            if req.state is LinkState.NOT_CRAWLED:
                self.schedule(req)

    def page_crawled(self, response: Response) -> None:
        """Count by response.url; meta is the request's."""
        meta = self.domain_metadata[origin_of(response.url)]
        meta["pages"] = meta.get("pages", 0) + 1
        response.meta[b"state"] = "mine"


class CountsThenDies(CrawlingStrategy):
    """Counts pages in the domain metadata; blocks on /slow (a group commit falls due as its
    action is recorded) and kills its own process on /die."""

    def page_crawled(self, response: Response) -> None:
        """Count, block, or die."""
        if response.url.endswith("/die"):
            os.kill(os.getpid(), signal.SIGKILL)
        meta = self.domain_metadata[origin_of(response.url)]
        meta["pages"] = meta.get("pages", 0) + 1
        if response.url.endswith("/slow"):
            time.sleep(float(self.args.get("sleep", 2.5)))
