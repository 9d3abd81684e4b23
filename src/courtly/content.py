"""What a response's body yields once outcome.read said what it is: a redirect's target, a file's
fingerprint, a sitemap's URLs, or an HTML page (directives, canonical, duplicates, content, links).

The page's CPU work runs in the page worker (analysis.py); the duplicate look-ups are the
store's; the links go through links.py. The exit code may change here (NOT_CANONICAL, NOINDEX,
DUPLICATE_CONTENT, TOO_MANY_REDIRECTS, OK for a sitemap).
"""

from __future__ import annotations

from collections.abc import Awaitable

from courtly import dedup, sitemaps
from courtly.analysis import PageAnalysis, PageSettings, compress_exchange
from courtly.config import CrawlConfig
from courtly.fetch import FetchError, HttpResponse
from courtly.links import Links, request_of
from courtly.model import CrawlAction, ExitCode
from courtly.outcome import Next, Reading, is_page, too_many_redirects
from courtly.pageworker import PageWorker, SentPage, TooComplex
from courtly.robots import product_token
from courtly.store.database import Database
from courtly.strategy import CrawlingStrategy
from courtly.strategy import Response as StrategyResponse
from courtly.urls import Rules


class ContentReader:
    """Reads the body of one crawl action's response into the action."""

    def __init__(
        self, config: CrawlConfig, db: Database, strategy: CrawlingStrategy, links: Links
    ) -> None:
        self.config = config
        self.db = db
        self.strategy = strategy
        self.links = links
        limits = config.limits
        self.pages = PageWorker(  # parse_html and links, in a worker process (pageworker.py)
            PageSettings(product_token(config.user_agent), limits.max_links_per_page,
                         limits.max_parse_size, config.dedup.near, config.dedup.min_words,
                         Rules.of(config.normalize), config.store_content,
                         anchors=not links.base_handlers),
            config.parse_workers, limits.max_parse_seconds,
        )

    def close(self) -> None:
        """Stop the page worker."""
        self.pages.close()

    def analysis(self, url: str, resp: HttpResponse | FetchError) -> SentPage | None:
        """A page sent to the page worker now, as its answer arrives (its analysis is pure: the
        worker goes on with it while the origin's last page is recorded); None: not a page, or
        no worker runs. Given to `read`, or cancelled."""
        if self.pages.workers <= 0 or isinstance(resp, FetchError) or not is_page(resp):
            return None
        return self.pages.send(*_worker_args(url, resp))

    def _analyse(self, url: str, resp: HttpResponse) -> Awaitable[PageAnalysis]:
        return self.pages.analyse(*_worker_args(url, resp))

    async def read(self, action: CrawlAction, reading: Reading, resp: HttpResponse,
                   sent: SentPage | None = None) -> None:
        """The response's metadata into the action, then what `reading.next` says (a page's
        analysis, when sent by `analysis`)."""
        headers = resp.headers
        action.http_status = resp.status
        action.content_type = headers.get("content-type")
        action.content_length = len(resp.body)
        action.etag = headers.get("etag")
        action.last_modified = headers.get("last-modified")
        action.redirect_target = reading.redirect_target
        step = reading.next
        if step is Next.PAGE:
            analysis = (self.pages.result(sent) if sent is not None
                        else self._analyse(action.candidate.url, resp))
            await self._page(action, resp, analysis)
        elif step is Next.REDIRECT:
            await self._redirect(action, reading)
        elif step is not Next.NOTHING:  # a file, maybe a sitemap
            action.content_hash = dedup.exact_fingerprint(resp.body)
            if step is Next.SITEMAP:
                self._sitemap(action, resp)
        if action.exit_code is ExitCode.NOT_MODIFIED:
            action.revisit_of = action.candidate.url
        kept = action.content or action.revisit_of
        if self.config.store_content and kept and action.exchange is None:
            # for WARC records (warc.py); a page's came compressed from the page worker
            action.exchange = compress_exchange(resp.request + resp.head)

    async def _redirect(self, action: CrawlAction, reading: Reading) -> None:
        """The target becomes a link, unless the chain of redirects is already too long."""
        most = self.config.limits.max_redirect_chain
        assert reading.redirect_target is not None
        if await self.db.redirect_chain(action.candidate.url, most) >= most:
            # the hop is recorded, its target is not queued: an endless chain stops here
            refused = too_many_redirects(most)
            action.exit_code, action.detail = refused.exit_code, refused.detail
        else:
            self.links.target(action, reading.redirect_target)
            if not self.links.policy.in_scope(reading.redirect_target):  # say so: a seed's
                # http:// → https:// or www. redirect otherwise ends the crawl without a word
                action.detail = (f"target {reading.redirect_target[:200]} not in scope "
                                 f"(scope = {self.config.policies.scope}): not queued")

    async def _page(self, action: CrawlAction, resp: HttpResponse,
                    analysis: Awaitable[PageAnalysis]) -> None:
        """An HTML page: directives, canonical, duplicates, content and links."""
        url = action.candidate.url
        try:
            page = await analysis
        except TooComplex as exc:
            action.exit_code, action.detail = ExitCode.TOO_COMPLEX, str(exc)
            return
        if page.canonical:
            action.canonical = page.canonical
            if self.links.policy.in_scope(page.canonical):
                action.exit_code = ExitCode.NOT_CANONICAL
                self.links.target(action, page.canonical)
                return
            # a canonical URL the crawl will never fetch (https:// for an http:// seed, another
            # host): the page is kept as its own, else the site's content would be lost
            action.detail = (f"canonical {page.canonical[:200]} not in scope "
                             f"(scope = {self.config.policies.scope}): kept")
        action.content_hash = dedup.exact_fingerprint(resp.body)
        rules = self.config.dedup
        wanted = None if page.nofollow else self.links.wanted(action, page.links)
        checked = not page.noindex  # a noindex page is no duplicate: it is not kept
        original, similar, unsettled = await self.db.page_lookups(
            action.content_hash if checked and rules.exact else None,
            page.near_signature if checked and rules.near else None, url,
            rules.min_similarity, *(wanted or (None, 0.0)))
        if page.noindex:
            action.exit_code = ExitCode.NOINDEX
        elif original is not None:
            action.exit_code = ExitCode.DUPLICATE_CONTENT
            action.duplicate_of = action.revisit_of = original
            action.exchange = page.exchange
            action.detail = f"exact duplicate of {original}"
            if not rules.follow_links_of_exact_duplicates:
                return
        elif rules.near and self._near_duplicate(action, page.near_signature, similar):
            if not rules.follow_links_of_near_duplicates:
                return
        else:
            action.content, action.exchange = page.content, page.exchange
        self.strategy.page_crawled(
            StrategyResponse(request_of(action.candidate), resp.status, str(action.exit_code),
                             resp.headers, resp.body, page.title)
        )
        if page.nofollow:
            action.detail = "nofollow"
            return
        self.links.page(action, page.links, unsettled)

    def _near_duplicate(self, action: CrawlAction, signature: bytes | None,
                        similar: tuple[str, float] | None) -> bool:
        """A similar enough OK page (MinHash signature of the text) makes this a duplicate."""
        action.near_signature = signature
        if similar is None:
            return False
        action.exit_code = ExitCode.DUPLICATE_CONTENT
        action.duplicate_of, score = similar
        action.detail = f"near-duplicate: similarity {score:.2f}"
        return True

    def _sitemap(self, action: CrawlAction, resp: HttpResponse) -> None:
        """A sitemap or sitemap index: its <loc> entries go to the strategy like links."""
        parsed = sitemaps.parse_sitemap(resp.body, self.config.limits)
        if parsed is None:
            return
        action.exit_code = ExitCode.OK
        kind = "sitemap index" if parsed.is_index else "sitemap"
        action.detail = f"{kind}: {len(parsed.locs)} URLs" + (" (truncated)" * parsed.truncated)
        self.links.sitemap(action, parsed.locs, parsed.is_index)


def _worker_args(url: str, resp: HttpResponse) -> tuple[str, bytes, str | None, str, bytes]:
    """What the page worker analyses of a response (the exchange is compressed there too)."""
    headers = resp.headers
    x_robots_tag = headers.get("x-robots-tag", "")
    if x_robots_tag:  # one header a line: a user agent's name is for its own header only
        x_robots_tag = "\n".join(
            value.decode("utf-8", "replace").strip() for name, _, value in (
                line.partition(b":") for line in resp.head.split(b"\r\n")[1:])
            if name.strip().lower() == b"x-robots-tag") or x_robots_tag
    return (url, resp.body, headers.get("content-type"), x_robots_tag, resp.request + resp.head)
