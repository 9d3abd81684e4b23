"""Plain data shared by the rooms: link states, exit codes, crawl actions, origin state."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any


class LinkState(StrEnum):
    """Frontera link states, persisted per crawl candidate."""

    NOT_CRAWLED = "NOT_CRAWLED"
    QUEUED = "QUEUED"
    CRAWLED = "CRAWLED"
    ERROR = "ERROR"


class ExitCode(StrEnum):
    """Why a crawl action ended. Extend, never overload."""

    OK = "OK"
    REDIRECT = "REDIRECT"
    NOT_MODIFIED = "NOT_MODIFIED"
    NOINDEX = "NOINDEX"
    NOT_CANONICAL = "NOT_CANONICAL"
    DUPLICATE_CONTENT = "DUPLICATE_CONTENT"
    BLOCKED_BY_ROBOTS_TXT = "BLOCKED_BY_ROBOTS_TXT"
    BLOCKED_URL_BY_LOCAL_POLICY = "BLOCKED_URL_BY_LOCAL_POLICY"
    BLOCKED_ADDRESS = "BLOCKED_ADDRESS"
    #: the origin was given up for this run (out of patience, robots.txt unavailable, Crawl-delay
    #: above the cap, a page budget) before this URL's turn: due again at once, for the next run
    ORIGIN_GIVEN_UP = "ORIGIN_GIVEN_UP"
    #: the origin spent this run's budget of crawl actions on URLs of this shape (traps)
    BLOCKED_BY_TRAP_BUDGET = "BLOCKED_BY_TRAP_BUDGET"
    HTTP_CLIENT_ERROR = "HTTP_CLIENT_ERROR"
    HTTP_SERVER_ERROR = "HTTP_SERVER_ERROR"
    RATE_LIMITED = "RATE_LIMITED"
    NETWORK_ERROR = "NETWORK_ERROR"
    #: the HTTP proxy could not be reached, or refused the request (CONNECT, 407)
    PROXY_ERROR = "PROXY_ERROR"
    PROTOCOL_ERROR = "PROTOCOL_ERROR"
    TIMEOUT = "TIMEOUT"
    TOO_LARGE = "TOO_LARGE"
    #: an HTML page the page worker did not analyse within limits.max_parse_seconds (markup made
    #: to be slow to parse): the worker is replaced, the page left unread
    TOO_COMPLEX = "TOO_COMPLEX"
    TOO_MANY_REDIRECTS = "TOO_MANY_REDIRECTS"  # a redirect past limits.max_redirect_chain
    UNSUPPORTED_CONTENT = "UNSUPPORTED_CONTENT"
    DATABASE_ERROR = "DATABASE_ERROR"
    #: courtly or the crawling strategy raised while handling the response (a bug: the detail
    #: names the exception and where it was raised)
    INTERNAL_ERROR = "INTERNAL_ERROR"

    @property
    def is_error(self) -> bool:
        """Counted as an error (the progress line, stats, the view): see ERRORS."""
        return self in ERRORS


#: exit codes that complete a crawl candidate (link state CRAWLED); the others leave it ERROR
COMPLETED = frozenset(
    {ExitCode.OK, ExitCode.REDIRECT, ExitCode.NOT_MODIFIED, ExitCode.NOINDEX,
     ExitCode.NOT_CANONICAL, ExitCode.DUPLICATE_CONTENT, ExitCode.UNSUPPORTED_CONTENT,
     ExitCode.BLOCKED_BY_ROBOTS_TXT, ExitCode.BLOCKED_URL_BY_LOCAL_POLICY,
     ExitCode.BLOCKED_BY_TRAP_BUDGET}
)
#: exit codes counted as errors: those that leave the candidate ERROR, but ORIGIN_GIVEN_UP (a URL
#: not tried because its origin was given up: the origin's reason says why)
ERRORS = frozenset(c for c in ExitCode if c not in COMPLETED and c is not ExitCode.ORIGIN_GIVEN_UP)
#: exit codes after which the URL is retried later in the same run
RETRY_IN_RUN = frozenset({ExitCode.RATE_LIMITED, ExitCode.NETWORK_ERROR, ExitCode.TIMEOUT})
#: exit codes of a failing server: the origin backs off exponentially, as after a 429 or 503
BACKS_OFF = frozenset(
    {ExitCode.HTTP_SERVER_ERROR, ExitCode.NETWORK_ERROR, ExitCode.TIMEOUT, ExitCode.PROTOCOL_ERROR}
)
#: exit codes that cost the origin one point of patience
COSTS_PATIENCE = BACKS_OFF | {ExitCode.INTERNAL_ERROR, ExitCode.PROXY_ERROR, ExitCode.TOO_COMPLEX}


def link_state(code: ExitCode, retry: bool) -> LinkState:
    """The link state a crawl action leaves its candidate in."""
    if retry:
        return LinkState.QUEUED
    return LinkState.CRAWLED if code in COMPLETED else LinkState.ERROR


@dataclass(slots=True)
class Candidate:
    """A crawl candidate taken into an origin's todo list."""

    id: int
    url: str
    depth: int
    score: float = 1.0
    etag: str | None = None
    last_modified: str | None = None
    content_hash: str | None = None
    attempts: int = 0
    recrawl_interval: float | None = None  # the interval set by the last crawl action
    exit_code: str | None = None  # the last crawl action's exit code
    #: what is requested instead of url: the Location of its redirect to itself, as written
    #: (/a → /a;jsessionid=…, which normalizes to /a), asked once more (never stored)
    request_url: str | None = None
    #: the cookies that redirect to itself set (`name=value; …`), sent with that request
    cookie: str | None = None

    def asked_as(self, url: str, cookie: str | None = None) -> Candidate:
        """This candidate, requested next as url (the Location of its redirect to itself), with
        the cookies that redirect set."""
        return replace(self, request_url=url, cookie=cookie)


@dataclass(slots=True)
class Link:
    """A link found on a page (or a redirect / canonical target) to become a candidate."""

    url: str
    origin: str
    depth: int
    score: float = 1.0


@dataclass(slots=True)
class CrawlAction:
    """Everything one crawl action produced, written by the store in one transaction."""

    candidate: Candidate
    origin: str
    exit_code: ExitCode
    started: float
    elapsed: float = 0.0
    http_status: int | None = None
    detail: str | None = None
    content_type: str | None = None
    content_length: int | None = None
    #: the validators the candidate keeps, when `revalidated` (else its stored ones stay)
    etag: str | None = None
    last_modified: str | None = None
    revalidated: bool = False
    content_hash: str | None = None
    content: bytes | None = None  # the body zstd-compressed (analysis.compress), when kept
    #: the request head as sent and the response head as received, in one zstd frame
    #: (analysis.compress_exchange), kept with the content or with a revisit
    exchange: bytes | None = None
    #: with WARC files (`crawl --warc`), a response whose body the database does not keep (a
    #: redirect, an error page, a file): its request and response heads, and its body, as
    #: received; written to the WARC files after the action, never to the database
    received: tuple[bytes, bytes, bytes] | None = None
    #: `received` was cut short, and why (WARC-Truncated: length, time, disconnect, unspecified)
    truncated: str | None = None
    #: the URL whose kept page this response revisits: its own (304) or an exact duplicate's
    revisit_of: str | None = None
    redirect_target: str | None = None
    canonical: str | None = None
    duplicate_of: str | None = None
    links: list[Link] = field(default_factory=list)
    #: a sitemap's entries and their <lastmod>: each is due now if last crawled before it
    modified: list[tuple[str, float]] = field(default_factory=list)
    next_due: float = 0.0
    recrawl_interval: float | None = None  # seconds from started to next_due
    near_signature: bytes | None = None  # MinHash signature of the text (courtly.dedup)
    #: a page whose text is a near-duplicate of its own last version's: no change (recrawl.py)
    similar_to_last: bool = False
    retry: bool = False  # crawl again later in this run (rate limited, transient)
    #: the origin's state, saved with the action when it changed the rate-limit pause (a restart
    #: or another worker then still waits it out)
    origin_state: OriginState | None = None


@dataclass(slots=True)
class StoredPage:
    """A page body the content table keeps (zstd-compressed), with when it was fetched."""

    url: str
    fetched: float
    content_type: str | None
    body: bytes
    exchange: bytes | None = None  # CrawlAction.exchange (None: kept before migration 9)


@dataclass(slots=True)
class StoredRevisit:
    """A response that revisited a kept page (a 304, or an exact duplicate's)."""

    url: str
    fetched: float
    exchange: bytes  # CrawlAction.exchange
    refers_to: str  # the kept page's URL
    refers_to_date: float  # when the kept page was fetched
    original: bytes  # the kept page's body (zstd), for its payload digest
    original_exchange: bytes | None = None  # the kept page's (None: kept before migration 9)


@dataclass(slots=True)
class OriginState:
    """Per-origin metadata that persists across runs (robots.txt, delays, counts)."""

    origin: str
    robots_body: bytes | None = None
    robots_status: int | None = None
    robots_fetched: float | None = None
    crawl_delay: float | None = None
    backoff_until: float = 0.0
    backoff_level: int = 0
    sitemaps: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    #: why the last robots.txt fetch failed, until one succeeds
    robots_error: str | None = None
    #: when its last request was answered (wall clock), as the last process that stopped
    #: cleanly left it; at a resume after kill -9, the resume's start (docs/reliability.md)
    last_request: float | None = None
