"""What a crawl action comes to: the crawl loop's decisions, as pure functions (no I/O, no clock).

The crawl loop (crawler.py) asks three questions here, in this order, and `courtly check`
(explain.py) asks the first one the same way:

1. `refusal`: may a candidate be fetched at all? Local policies first, then robots.txt.
2. `read`: what does the response (or the fetch error) say? An exit code, a detail, what the
   loop reads next of the body (`Next`), a redirect's target, a rate limit's pause.
3. `settle`: once the action's exit code is final (after the body was read), what it costs the
   origin (patience, backoff), whether the URL is retried in this run, the link state it leaves
   and when the URL is due again.

Each reads the origin crawler it is given and never changes it: the loop applies the decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, auto

from courtly import sitemaps, sniff
from courtly.config import CrawlConfig, Politeness
from courtly.errors import one_line
from courtly.fetch import FetchError, HttpResponse
from courtly.model import (
    BACKS_OFF,
    COSTS_PATIENCE,
    RETRY_IN_RUN,
    Candidate,
    CrawlAction,
    ExitCode,
    LinkState,
    link_state,
)
from courtly.parse import refresh, refresh_redirect
from courtly.policy import Policy, ShapeBudget
from courtly.recrawl import interval
from courtly.robots import RobotsRules
from courtly.scheduler import (
    Ending,
    EndKind,
    OriginCrawler,
    backoff,
    delay_for,
    effective_crawl_delay,
    http_date,
    retry_after_seconds,
)
from courtly.urls import normalize, resolve

#: what a request comes to: a response, or the reason there is none
Answer = HttpResponse | FetchError
#: the HTTP statuses of a redirect
REDIRECTS = frozenset({301, 302, 303, 307, 308})
_HTML_TYPES = ("text/html", "application/xhtml+xml")
#: answers after which the origin's backoff goes on
_NOT_A_SUCCESS = BACKS_OFF | {ExitCode.RATE_LIMITED, ExitCode.INTERNAL_ERROR}


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a candidate is not fetched: its exit code and the deciding rule."""

    exit_code: ExitCode
    rule: str


def refusal(
    url: str, depth: int, policy: Policy, robots: RobotsRules | None,
    shapes: ShapeBudget | None = None,
) -> Refusal | None:
    """The local policies' verdict, then robots.txt's (None: not fetched yet, or not obeyed),
    then the origin's trap budget for the URL's shape, which a URL passing the rest spends (the
    one decision here that counts; None: not checked, as `courtly check` does)."""
    verdict = policy.check(url, depth)
    if not verdict.allowed:
        return Refusal(ExitCode.BLOCKED_URL_BY_LOCAL_POLICY, verdict.rule)
    if robots is not None and (rule := robots.disallowed_by(url)) is not None:
        return Refusal(ExitCode.BLOCKED_BY_ROBOTS_TXT, rule)
    if shapes is not None and not (verdict := shapes.spend(url, depth)).allowed:
        return Refusal(ExitCode.BLOCKED_BY_TRAP_BUDGET, verdict.rule)
    return None


def validators(candidate: Candidate) -> dict[str, str] | None:
    """The conditional GET's headers, when the last crawl action stored validators."""
    if not candidate.etag and not candidate.last_modified:
        return None
    headers = {}
    if candidate.etag:
        headers["If-None-Match"] = candidate.etag
    if candidate.last_modified:
        headers["If-Modified-Since"] = candidate.last_modified
    return headers


def headers_of(candidate: Candidate) -> dict[str, str] | None:
    """The headers of a candidate's request: its validators, and the cookies its redirect to
    itself set."""
    headers = validators(candidate)
    if candidate.cookie is None:
        return headers
    return {**(headers or {}), "Cookie": candidate.cookie}


def kept_validators(
    headers: Mapping[str, str], wall: float, stored: Candidate | None = None
) -> tuple[str | None, str | None]:
    """The ETag and Last-Modified a candidate keeps from a response (wall: when it came): a new
    body's own; a 304's updating the `stored` ones (RFC 9111 §4.3.4). A Last-Modified that is no
    HTTP-date, or later than the response's Date (else than `wall`), is not kept: sent back as
    If-Modified-Since it would make a server comparing dates answer 304 to every later change."""
    etag = headers.get("etag") or None
    modified = headers.get("last-modified") or None
    if modified is not None:
        when, sent = http_date(modified), http_date(headers.get("date"))
        if when is None or when > (wall if sent is None else sent):
            modified = None
    if stored is not None:
        etag = etag or stored.etag
        modified = modified or stored.last_modified
    return etag, modified


def ending(crawler: OriginCrawler, config: CrawlConfig) -> Ending | None:
    """Whether an origin must finish before its work does: robots.txt's Crawl-delay is above the
    cap (with crawl_delay_above_cap = "skip"), or the origin's page budget (a trap guard) is
    spent."""
    delay = crawler.state.crawl_delay
    if effective_crawl_delay(delay, config.politeness) is None:
        return Ending(EndKind.CRAWL_DELAY, f"Crawl-delay {delay}s is above the cap")
    most = config.traps.max_pages_per_origin
    if most and crawler.pages_this_run >= most:
        return Ending(EndKind.TRAP, f"trap: max_pages_per_origin {most}")
    return None


def keeps_alive(crawler: OriginCrawler, config: CrawlConfig) -> bool:
    """Whether the origin's next request may find this one's connection still open: its delay
    is shorter than limits.keep_alive (a broad crawl's is not: its connections close at once)."""
    return delay_for(crawler, config.politeness) < config.limits.keep_alive


class Next(Enum):
    """What the crawl loop reads of a response's body after `read`."""

    NOTHING = auto()
    REDIRECT = auto()  # the target becomes a link, unless the redirect chain is too long
    FILE = auto()  # not HTML: its fingerprint is recorded
    SITEMAP = auto()  # not HTML, looks like a sitemap: fingerprinted, its <loc>s become links
    PAGE = auto()  # HTML: analysed (directives, canonical, duplicates, links)


@dataclass(frozen=True, slots=True)
class Reading:
    """What a response or a fetch error says, before its body is read."""

    exit_code: ExitCode
    next: Next = Next.NOTHING
    detail: str | None = None
    redirect_target: str | None = None
    #: a redirect to the URL itself once normalized: its Location as written, asked once more
    again: str | None = None
    #: the cookies that redirect set, sent with `again`
    cookie: str | None = None
    #: RATE_LIMITED: the origin stays away this many seconds, at this backoff level
    pause: float | None = None
    backoff_level: int = 0


_PAGE = Reading(ExitCode.OK, Next.PAGE)
_FILE = Reading(ExitCode.UNSUPPORTED_CONTENT, Next.FILE)
_SITEMAP = Reading(ExitCode.UNSUPPORTED_CONTENT, Next.SITEMAP)
_NOT_MODIFIED = Reading(ExitCode.NOT_MODIFIED)
_CLIENT_ERROR = Reading(ExitCode.HTTP_CLIENT_ERROR)
#: a 304 to a request without validators: nothing stored is confirmed (RFC 9110 §15.4.5)
_UNASKED_304 = Reading(ExitCode.PROTOCOL_ERROR,
                       detail="304 Not Modified to a request without validators")


def read(
    url: str,
    result: Answer,
    crawler: OriginCrawler,
    config: CrawlConfig,
    now: float,
    wall: float,
    jitter: float,
    asked: str | None = None,
    conditional: bool = False,
) -> Reading:
    """The exit code of a response by its status and type, or of a fetch error.

    now / wall: the monotonic and the wall-clock time of the answer; jitter: the backoff's
    random factor (scheduler.backoff_jitter); asked: the URL requested, when not url (the
    Location of url's redirect to itself); conditional: the request carried validators (a
    304 answers nothing else).
    """
    if isinstance(result, FetchError):
        if result.exit_code in BACKS_OFF:  # the server failed: the origin backs off
            level, seconds = backoff(crawler, None, config.politeness, now, jitter)
            return Reading(result.exit_code, detail=result.detail, pause=seconds,
                           backoff_level=level)
        return Reading(result.exit_code, detail=result.detail)
    status = result.status
    if status in (429, 503):
        wait = retry_after_seconds(result.headers.get("retry-after"), wall)
        level, seconds = backoff(crawler, wait, config.politeness, now, jitter)
        capped = f" (Retry-After {wait:.0f}s capped)" if wait is not None and wait > seconds else ""
        return Reading(ExitCode.RATE_LIMITED, detail=f"paused {seconds:.1f}s{capped}",
                       pause=seconds, backoff_level=level)
    if status >= 500 and status < 600:
        level, seconds = backoff(crawler, None, config.politeness, now, jitter)
        return Reading(ExitCode.HTTP_SERVER_ERROR, detail=f"backed off {seconds:.1f}s",
                       pause=seconds, backoff_level=level)
    if status in REDIRECTS:
        location = result.headers.get("location", "").strip()
        target = normalize(location, url, config.normalize) if location else None
        if target is None:
            detail = f"no usable Location ({one_line(location) or 'none'}): not queued"
            return Reading(ExitCode.REDIRECT, detail=detail)
        if target == url:
            return _to_itself(url, location, asked, set_cookies(result.head))
        return Reading(ExitCode.REDIRECT, Next.REDIRECT, redirect_target=target)
    if status == 304:
        return _NOT_MODIFIED if conditional else _UNASKED_304
    if status >= 600 or 300 <= status < 400 or status < 200:
        return Reading(ExitCode.PROTOCOL_ERROR, detail=f"unexpected status {status}")
    if status >= 400:
        return _CLIENT_ERROR
    if (header := result.headers.get("refresh")) is not None:  # a page's or a file's
        moved = refresh_redirect(refresh(header), url, url, config.normalize)
        if moved is not None:  # a redirect, as a browser follows it: the body is not read
            return Reading(ExitCode.REDIRECT, Next.REDIRECT, f"Refresh header after {moved[1]} s",
                           redirect_target=moved[0])
    if is_page(result):
        return _PAGE
    if sitemaps.looks_like_sitemap(url, result.headers.get("content-type"), result.body):
        return _SITEMAP
    return _FILE


def _to_itself(url: str, location: str, asked: str | None, cookie: str | None) -> Reading:
    """A redirect to the URL itself once normalized: a Java server's /a → /a;jsessionid=… (the
    session id is removed) wants the session in the URL, and a redirect setting a cookie wants
    it sent. Its Location is asked once more as written (with the cookies it set), when it
    differs or sets a cookie; a second one gives up (no target queued, no redirect saved)."""
    written = resolve(location, asked or url)
    if asked is None and written is not None and (written != url or cookie is not None):
        detail = ("redirects to itself setting a cookie: asked once more with it"
                  if written == url else
                  "redirects to itself once normalized: its Location asked once more as written")
        return Reading(ExitCode.REDIRECT, detail=detail, again=written, cookie=cookie)
    again = "" if asked is None else " with its cookies, again" if asked == url else (
        " once normalized, again")
    return Reading(ExitCode.REDIRECT, detail=f"redirects to itself{again}: not queued")


def set_cookies(head: bytes) -> str | None:
    """The `name=value` pairs of a response's Set-Cookie headers, as a Cookie header sends them
    (RFC 6265 §5.2: each up to its first ";"); None if it sets none. By hand: the headers are
    read from the head, as http.cookies cannot split the ones a dict joined with ", "."""
    pairs = [value.decode("latin-1").partition(";")[0].strip()
             for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
             if name.strip().lower() == b"set-cookie"]
    return "; ".join(pair for pair in pairs if "=" in pair) or None


def is_page(resp: HttpResponse) -> bool:
    """A 2xx HTML answer: `read` says Next.PAGE of it, whatever the origin's state (unless its
    Refresh header makes it a redirect). Without a Content-Type naming a type, the body's first
    bytes say whether it is HTML (sniff.py); a sitemap typed HTML is none (sitemaps.xml_head)."""
    if not 200 <= resp.status < 300:
        return False
    content_type = sniff.content_type(resp.headers.get("content-type"), resp.body)
    return content_type.lower().startswith(_HTML_TYPES) and not sitemaps.xml_head(resp.body)


def too_many_redirects(limit: int) -> Reading:
    """A redirect whose chain already has `limit` hops: recorded, its target not queued."""
    return Reading(ExitCode.TOO_MANY_REDIRECTS,
                   detail=f"redirect chain longer than {limit} hops; target not queued")


def given_up(left: list[Candidate], crawler: OriginCrawler, now: float) -> list[CrawlAction]:
    """The crawl actions of the URLs an origin given up has left: ORIGIN_GIVEN_UP, the origin's
    ending as their detail."""
    why = crawler.ending.text if crawler.ending else None
    return [CrawlAction(c, crawler.origin, ExitCode.ORIGIN_GIVEN_UP, now, detail=why)
            for c in left]


def internal_error(action: CrawlAction, detail: str) -> CrawlAction:
    """The crawl action of a response whose handling raised: what it had found is dropped."""
    return CrawlAction(action.candidate, action.origin, ExitCode.INTERNAL_ERROR, action.started,
                       http_status=action.http_status, content_type=action.content_type,
                       content_length=action.content_length, detail=detail)


@dataclass(frozen=True, slots=True)
class Settlement:
    """What a finished crawl action costs its origin and leaves its URL."""

    patience: int
    ending: Ending | None  # why the origin would finish now (None: it would not)
    retry: bool  # crawled again later in this run
    reset_backoff: bool  # a success (not a rate limit, nor a failing server) ends the backoff
    link_state: LinkState
    #: seconds until the URL is due again (None when it is retried in this run)
    recrawl_interval: float | None


def settle(action: CrawlAction, crawler: OriginCrawler, config: CrawlConfig) -> Settlement:
    """Patience, backoff, retry, link state and recrawl interval of a finished crawl action."""
    rules: Politeness = config.politeness
    code = action.exit_code
    patience, ending = crawler.patience, crawler.ending
    answered = action.http_status is not None and code not in _NOT_A_SUCCESS
    # a rate limit after another (or after a failure), no answer between: the server is down
    again = code is ExitCode.RATE_LIMITED and crawler.state.backoff_level > 1
    if code in COSTS_PATIENCE or again:
        patience -= 1
        ending = Ending(EndKind.OUT_OF_PATIENCE, f"out of patience after {code}: {action.detail}")
    elif answered:
        patience, ending = rules.patience, None
    retry = code in RETRY_IN_RUN and action.candidate.attempts < rules.max_retries
    reset = answered and bool(crawler.state.backoff_until or crawler.state.backoff_level)
    due = None if retry else interval(action, action.candidate, config.recrawl, config.robots)
    return Settlement(patience, ending, retry, reset, link_state(code, retry), due)
