"""What a response's body yields once outcome.read said what it is: a redirect's target, a file's
fingerprint, a sitemap's URLs, or an HTML page (meta refresh, directives, canonical, duplicates,
content, links); a file's or a page's canonical URL (a Link header's, a page's link element).

The page's CPU work runs in the page worker (analysis.py); the duplicate look-ups are the
store's; the links go through links.py. The exit code may change here (NOT_CANONICAL, NOINDEX,
DUPLICATE_CONTENT, TOO_MANY_REDIRECTS, REDIRECT for a meta refresh, OK for a sitemap).
"""

from __future__ import annotations

from collections.abc import Awaitable

from courtly import dedup, outcome, sitemaps
from courtly.analysis import PageAnalysis, PageSettings, compress_exchange, header_canonical
from courtly.config import CrawlConfig
from courtly.fetch import FetchError, HttpResponse
from courtly.links import Links, request_of
from courtly.model import CrawlAction, ExitCode
from courtly.outcome import Next, Reading, is_page, too_many_redirects
from courtly.pageworker import PageWorker, SentPage, TooComplex
from courtly.robots import RobotsRules, product_token
from courtly.robots_cache import matching
from courtly.store.database import Database
from courtly.strategy import CrawlingStrategy
from courtly.strategy import Response as StrategyResponse
from courtly.urls import Rules, origin_of, path_depth

#: a canonical URL's last exit codes that keep the page naming it as its own: the crawl will
#: never keep that URL (it is never fetched, or answered 4xx)
_NEVER_KEPT = frozenset({ExitCode.BLOCKED_BY_ROBOTS_TXT, ExitCode.BLOCKED_URL_BY_LOCAL_POLICY,
                         ExitCode.HTTP_CLIENT_ERROR})
#: how many canonical links recorded from a page's canonical URL on are followed to find a loop
#: back to the page
CANONICAL_HOPS = 10


class ContentReader:
    """Reads the body of one crawl action's response into the action."""

    def __init__(
        self, config: CrawlConfig, db: Database, strategy: CrawlingStrategy, links: Links
    ) -> None:
        self.config = config
        self.db = db
        self.strategy = strategy
        self.links = links
        #: the canonical URL of each response found NOT_CANONICAL and not yet recorded (by
        #: URL): another origin's page naming it back is decided on it (`recorded` drops it)
        self.naming: dict[str, str] = {}
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

    def recorded(self, action: CrawlAction) -> None:
        """The action's write is queued: once the reads queued before it are answered (a page
        that waited on one decides on `naming`), the database's answers name its canonical URL."""
        url = action.candidate.url
        if url in self.naming:
            self.db.later(_nothing).add_done_callback(lambda _: self.naming.pop(url, None))

    def analysis(self, url: str, resp: HttpResponse | FetchError) -> SentPage | None:
        """A page sent to the page worker now, as its answer arrives (its analysis is pure: the
        worker goes on with it while the origin's last page is recorded); None: not a page, or
        no worker runs. Given to `read`, or cancelled."""
        if self.pages.workers <= 0 or isinstance(resp, FetchError) or not is_page(resp):
            return None
        return self.pages.send(*_worker_args(url, resp))

    def _analyse(self, url: str, resp: HttpResponse, own: bool = False
                 ) -> Awaitable[PageAnalysis]:
        return self.pages.analyse(*_worker_args(url, resp), own)

    async def read(self, action: CrawlAction, reading: Reading, resp: HttpResponse | FetchError,
                   sent: SentPage | None = None, robots: RobotsRules | None = None) -> None:
        """The response's metadata into the action, then what `reading.next` says (a page's
        analysis, when sent by `analysis`). robots: the origin's rules, which may refuse the
        canonical URL the response names. A fetch error: the response it cut short, if any,
        for the WARC files."""
        if isinstance(resp, FetchError):
            if self.config.warc.dir is not None and resp.partial is not None:
                action.received, action.truncated = resp.partial, resp.cut
            return
        headers = resp.headers
        action.http_status = resp.status
        action.content_type = headers.get("content-type")
        action.content_length = len(resp.body)
        action.redirect_target = reading.redirect_target
        step = reading.next
        if step is Next.PAGE:
            analysis = (self.pages.result(sent) if sent is not None
                        else self._analyse(action.candidate.url, resp))
            await self._page(action, resp, analysis, robots)
        elif step is Next.REDIRECT:
            assert reading.redirect_target is not None
            await self._redirect(action, reading.redirect_target)
        elif step is not Next.NOTHING:  # a file, maybe a sitemap; maybe not its canonical URL
            canonical = header_canonical(action.candidate.url, headers.get("link", ""),
                                         self.pages.settings.normalize)
            if not await self._moved(action, canonical, robots):
                action.content_hash = dedup.exact_fingerprint(resp.body)
                if step is Next.SITEMAP:
                    self._sitemap(action, resp)
        if action.exit_code is ExitCode.NOT_MODIFIED:
            action.revisit_of = action.candidate.url
        if action.content_hash is not None or action.exit_code is ExitCode.NOT_MODIFIED:
            # the validators are the kept body's: a new one's replace them, a 304's update them
            action.etag, action.last_modified = outcome.kept_validators(
                headers, action.started,
                action.candidate if action.content_hash is None else None)
            action.revalidated = True
        kept = action.content or action.revisit_of
        if self.config.store_content and kept and action.exchange is None:
            # for WARC records (warc.py); a page's came compressed from the page worker
            action.exchange = compress_exchange(resp.request + resp.head)
        if self.config.warc.dir is not None and action.content is None:
            action.received = (resp.request, resp.head, resp.body)  # its records (warc.py)

    async def _redirect(self, action: CrawlAction, target: str) -> None:
        """The target becomes a link, unless the chain of redirects is already too long."""
        most = self.config.limits.max_redirect_chain
        action.redirect_target = target
        if await self.db.redirect_chain(action.candidate.url, most) >= most:
            # the hop is recorded, its target is not queued: an endless chain stops here
            refused = too_many_redirects(most)
            action.exit_code, action.detail = refused.exit_code, refused.detail
        else:
            self.links.target(action, target)
            if not self.links.policy.in_scope(target):  # say so: a seed's http:// → https://
                # or www. redirect otherwise ends the crawl without a word
                action.detail = (f"target {target[:200]} not in scope "
                                 f"(scope = {self.config.policies.scope}): not queued")

    async def _moved(self, action: CrawlAction, canonical: str | None,
                     robots: RobotsRules | None) -> bool:
        """Whether the response is discarded for the canonical URL it names (NOT_CANONICAL, the
        URL queued); not when the crawl would never keep that URL (`_never_kept`): the detail
        then says why the response is kept as its own."""
        url = action.candidate.url
        if canonical is None or canonical == url:
            return False
        action.canonical = canonical
        # the last look (no wait after it): a page naming this one, decided meanwhile
        why = await self._never_kept(action, canonical, robots) or _names_back(
            url, self.naming.get(canonical))
        if why is None:
            self.naming[url] = canonical
            action.exit_code = ExitCode.NOT_CANONICAL
            self.links.target(action, canonical)
            return True
        action.detail = f"canonical {canonical[:200]} {why}: kept"
        return False

    async def _never_kept(self, action: CrawlAction, canonical: str,
                          robots: RobotsRules | None) -> str | None:
        """Why the crawl would never keep the canonical URL, if it would not: out of scope
        (https:// for an http:// seed, another host), refused by the policies or the origin's
        robots.txt, last recorded as a 4xx or refused, or naming canonical URLs that lead back
        to this page (a loop: of pages naming each other, the last crawled is kept). Else the
        site's content would be lost."""
        policy = self.links.policy
        if not policy.in_scope(canonical):
            return f"not in scope (scope = {self.config.policies.scope})"
        if robots is not None and origin_of(canonical) == action.origin:
            robots = await matching(robots, canonical)
        else:
            robots = None  # another origin's: its robots.txt is judged when it is crawled
        refused = outcome.refusal(canonical, action.candidate.depth, policy, robots)
        if refused is not None:
            return f"is {refused.exit_code} ({refused.rule})"
        return await self._leads_back(action.candidate.url, canonical)

    async def _leads_back(self, url: str, canonical: str) -> str | None:
        """Why url's page is kept: its canonical URL was refused or a 4xx, or the canonical URLs
        recorded from it on lead back to url (a loop). None if they end elsewhere: in a chain
        A → B → C, A is NOT_CANONICAL for B whatever B names (one hop, as search engines
        follow it), and the chain's end is kept."""
        hop = canonical
        for hops in range(1, CANONICAL_HOPS + 1):
            named = self.naming.get(hop)
            if named is None:
                known = await self.db.candidate(hop)
                if known is None:
                    return None
                if hops == 1 and known["exit_code"] in _NEVER_KEPT:
                    return f"was {known['exit_code']}"
                if known["exit_code"] != ExitCode.NOT_CANONICAL:
                    return None
                named = str(known["canonical"])
            if named == url:
                return _names_back(url, named) if hops == 1 else (
                    f"is one of {hops + 1} pages naming each other in a loop")
            hop = named
        return None

    async def _page(self, action: CrawlAction, resp: HttpResponse,
                    analysis: Awaitable[PageAnalysis], robots: RobotsRules | None) -> None:
        """An HTML page: meta refresh, directives, canonical, duplicates, content and links."""
        url = action.candidate.url
        try:
            page = await analysis
            if page.refresh is not None:  # a redirect, as a browser follows it
                action.exit_code, action.detail = ExitCode.REDIRECT, (
                    f"meta refresh after {page.refresh[1]} s")
                await self._redirect(action, page.refresh[0])
                return
            if page.canonicals is not None:  # two canonical URLs: neither is followed
                element, header = (u[:200] for u in page.canonicals)
                action.detail = (f"canonical link element {element} and Link header {header} "
                                 "disagree: kept")
            elif await self._moved(action, page.canonical, robots):
                return
            elif page.partial:  # kept as its own after all: read whole
                page = await self._analyse(url, resp, own=True)
        except TooComplex as exc:
            action.exit_code, action.detail = ExitCode.TOO_COMPLEX, str(exc)
            return
        action.content_hash = dedup.exact_fingerprint(resp.body)
        rules = self.config.dedup
        wanted = None if page.nofollow else self.links.wanted(action, page.links)
        checked = not page.noindex  # a noindex page is no duplicate: it is not kept
        links, score = wanted or (None, 0.0)
        last = action.candidate  # a recrawl with a new body: is its text its last one's?
        own = last.id if last.content_hash not in (None, action.content_hash) else None
        original, similar, unsettled, itself = await self.db.page_lookups(
            action.content_hash if checked and rules.exact else None,
            page.near_signature if checked and rules.near else None, url,
            rules.min_similarity, links, score, own)
        action.similar_to_last = itself is not None and itself >= rules.min_similarity
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
            if not rules.follow_links_of_near_duplicates or self._nests(action):
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
        """A similar enough OK page (MinHash signature of the text) makes this a duplicate.
        The signature stored is that of the page's last version seen as changed: one near it
        keeps it, so that small edits add up to a change (docs/recrawl.md)."""
        keeps_last = action.similar_to_last and action.candidate.exit_code == ExitCode.OK
        if similar is not None or not keeps_last:
            action.near_signature = signature
        if similar is None:
            return False
        action.exit_code = ExitCode.DUPLICATE_CONTENT
        action.duplicate_of, score = similar
        action.detail = f"near-duplicate: similarity {score:.2f}"
        return True

    def _nests(self, action: CrawlAction) -> bool:
        """Whether a near-duplicate's path is deeper than its original's (a soft 404's relative
        links nesting for ever, /a/b/ → /a/b/a/ → …): then its links are not followed."""
        assert action.duplicate_of is not None
        if (self.config.dedup.follow_links_of_deeper_near_duplicates
                or path_depth(action.candidate.url) <= path_depth(action.duplicate_of)):
            return False
        action.detail = f"{action.detail}, deeper than its original: links not followed"
        return True

    def _sitemap(self, action: CrawlAction, resp: HttpResponse) -> None:
        """A sitemap or sitemap index: its <loc> entries go to the strategy like links."""
        parsed = sitemaps.parse_sitemap(resp.body, self.config.limits)
        if parsed is None:
            return
        action.exit_code = ExitCode.OK
        dropped = self.links.sitemap(action, parsed.locs, parsed.is_index,
                                     dict(parsed.modified(action.started)))
        notes = [f"{dropped} not followed (out of scope or not http(s))"] * bool(dropped)
        if parsed.truncated:
            notes.append(f"more than {self.config.limits.max_sitemap_entries} entries: the "
                         "rest not read")
        if parsed.cut_short:
            notes.append("gzip cut short: read as far as it goes")
        action.detail = ", ".join([f"{parsed.label}: {len(parsed.locs)} URLs", *notes])


def _nothing() -> None:
    """A call queued after the writes (Database.later), to know when they are read."""


def _names_back(url: str, named: str | None) -> str | None:
    """Why url's page is kept if the page at its canonical URL names it (`named`) in turn."""
    return f"itself names canonical {url[:200]}" if named == url else None


def _worker_args(url: str, resp: HttpResponse
                 ) -> tuple[str, bytes, str | None, str, bytes, str]:
    """What the page worker analyses of a response (the exchange is compressed there too)."""
    headers = resp.headers
    x_robots_tag = headers.get("x-robots-tag", "")
    if x_robots_tag:  # one header a line: a user agent's name is for its own header only
        x_robots_tag = "\n".join(
            value.decode("utf-8", "replace").strip() for name, _, value in (
                line.partition(b":") for line in resp.head.split(b"\r\n")[1:])
            if name.strip().lower() == b"x-robots-tag") or x_robots_tag
    return (url, resp.body, headers.get("content-type"), x_robots_tag, resp.request + resp.head,
            headers.get("link", ""))
