"""Found URLs → normalized → in scope (policies) → the crawling strategy → scheduled `Link`s.

Pages' links, sitemaps' <loc>s, redirect and canonical targets and what the strategy schedules
on its own all come through here. Each link's origin is announced (`Admit`) so the crawl loop can
give a new origin in scope its crawler, or wake one that had run out of work.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from courtly.config import Normalize
from courtly.errors import describe
from courtly.model import COMPLETED, Candidate, CrawlAction, Link, LinkState, OriginState
from courtly.policy import Policy
from courtly.store import StoreError
from courtly.store.database import Database
from courtly.strategy import CrawlingStrategy, Request, StrategyContext, breadth_first_score
from courtly.urls import normalize, origin_of

log = logging.getLogger("courtly")

#: called with each scheduled URL and its origin before it becomes a Link
Admit = Callable[[str, str], None]


def request_of(candidate: Candidate) -> Request:
    """The strategy's view of a candidate being crawled."""
    return Request(candidate.url, candidate.depth, candidate.score, state=LinkState.QUEUED)


class Links:
    """Turns what a crawl action found into the links it records, through the strategy."""

    def __init__(
        self, strategy: CrawlingStrategy, db: Database, policy: Policy, rules: Normalize,
        admit: Admit, context: StrategyContext,
    ) -> None:
        self.strategy = strategy
        self.context = context  # the one the strategy is bound to
        self.db = db
        self.policy = policy  # rescoped in place when a fleet's seeds are added (steering.py)
        self.rules = rules
        self.admit = admit
        self.base_handlers = strategy.has_base_link_handlers()

    def opened(self, origin: str, sitemaps: list[str]) -> list[Link]:
        """An origin's first turn: the strategy hears of it (and of its sitemaps)."""
        self.strategy.origin_opened(origin, sitemaps)
        return self.scheduled()

    def wanted(self, action: CrawlAction, links: list[tuple[str, str]]
               ) -> tuple[list[str], float]:
        """The URLs of a page's links whose states `page` needs, and their score (read with the
        page's other look-ups: Store.page_lookups; for a strategy with handlers of its own, so
        that the seen cache answers its `refresh_states` without a wait)."""
        in_scope = self.policy.in_scope
        return ([url for url, _ in links if in_scope(url)],
                breadth_first_score(action.candidate.depth + 1))

    def page(self, action: CrawlAction, links: list[tuple[str, str]],
             unsettled: list[str] | None) -> None:
        """A page's links (normalized, with their anchor text) in scope, through the strategy.

        A strategy with the base class's link handlers gets their result without the objects:
        `unsettled`, the links never crawled (`wanted`, less those already candidates with at
        least that score: their upsert would change nothing, and their origin has its crawler
        since they were added), with `breadth_first_score` (no per-link Request and Scheduled).
        """
        depth = action.candidate.depth + 1
        if not self.base_handlers or unsettled is None:
            in_scope = self.policy.in_scope
            found = [Request(url, depth, meta={"anchor": text})
                     for url, text in links if in_scope(url)]
            self.found(action, found, vetted=True)
            return
        score = breadth_first_score(depth)
        action.links.extend(self.scheduled())  # what page_crawled scheduled, if anything
        action.links.extend(self._link(url, depth, score) for url in unsettled)

    def sitemap(self, action: CrawlAction, locs: list[str], is_index: bool,
                modified: dict[str, float]) -> int:
        """A sitemap's <loc> entries, normalized and in scope, through the strategy; how many
        were not (no http(s) URL, or out of scope). Those with a <lastmod> to believe
        (`modified`, by <loc>) go to `action.modified`: due if crawled before it (recrawl.md)."""
        depth = action.candidate.depth + 1
        meta = {"sitemap": True} if is_index else {"from_sitemap": True}
        found = []
        for loc in locs:
            target = normalize(loc, action.candidate.url, self.rules)
            if target is not None and self.policy.in_scope(target):
                found.append(Request(target, depth, meta=dict(meta)))
                if (when := modified.get(loc)) is not None:
                    self.admit(target, origin_of(target))
                    action.modified.append((target, when))
        self.found(action, found, vetted=True)
        return len(locs) - len(found)

    def target(self, action: CrawlAction, url: str) -> None:
        """A redirect's or a canonical link's target, one level as deep as the candidate."""
        self.found(action, [Request(url, action.candidate.depth)])

    def found(self, action: CrawlAction, links: list[Request], vetted: bool = False) -> None:
        """Pass links through the strategy; what it schedules in scope becomes candidates.

        vetted: the links are already normalized and in scope (not checked a second time).
        """
        request = request_of(action.candidate)
        kept = self.strategy.filter_extracted_links(request, links)
        if not isinstance(kept, list | tuple):
            raise TypeError("filter_extracted_links() must return a list of Requests, not "
                            f"{type(kept).__name__}")
        kept = list(kept)
        self.strategy.refresh_states(kept)
        self.strategy.links_extracted(request, kept)
        action.links.extend(self.scheduled({r.url for r in links} if vetted else ()))

    def ended(self, action: CrawlAction, state: OriginState) -> None:
        """A crawl action about to be recorded: the strategy hears of its error (a handler that
        raises is a warning line: the action keeps its exit code), and the domain metadata it
        changed is written, its origin's with the action (one transaction)."""
        if action.exit_code not in COMPLETED and not action.retry:
            try:
                self.strategy.request_error(request_of(action.candidate), str(action.exit_code))
            except StoreError:
                raise
            except Exception as exc:
                log.warning("internal error on %s: strategy request_error(): %s",
                            action.candidate.url, describe(exc))
        if not action.links:
            action.links = self.scheduled()
        changed = self.strategy.domain_metadata.changed()
        own = changed.pop(action.origin, None)
        if own is not None:
            state.metadata = own
            action.origin_state = state
        for origin, data in changed.items():
            self.context.save_metadata(origin, data)

    def scheduled(self, vetted: Collection[str] = ()) -> list[Link]:
        """What the strategy scheduled since last asked, normalized and in scope."""
        out = []
        for item in self.strategy.take_scheduled():
            url = item.request.url
            if url not in vetted:
                normalized = normalize(url, None, self.rules)
                if normalized is None or not self.policy.in_scope(normalized):
                    continue
                url = normalized
            if not item.dont_queue:
                out.append(self._link(url, item.request.depth, item.score))
        return out

    def _link(self, url: str, depth: int, score: float) -> Link:
        origin = origin_of(url)
        self.admit(url, origin)
        return Link(url, origin, depth, score)
