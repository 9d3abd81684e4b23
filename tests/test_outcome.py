"""outcome.py's decisions, table by table, without a network: what a response or a fetch error
comes to, what a finished action costs its origin and leaves its URL, and which candidates are
refused before any request."""

from __future__ import annotations

import pytest

from courtly import outcome, sniff
from courtly.config import CrawlConfig, Policies
from courtly.fetch import FetchError, HttpResponse
from courtly.model import Candidate, CrawlAction, ExitCode, LinkState
from courtly.outcome import Next
from courtly.policy import Policy
from courtly.robots import rules_for_status
from courtly.scheduler import Ending, EndKind, OriginCrawler
from courtly.store import OriginState

URL = "http://a.test/page"
CONFIG = CrawlConfig()
NOW, WALL = 1000.0, 1_800_000_000.0
LAST_MODIFIED = "Wed, 21 Oct 2015 07:28:00 GMT"
SITEMAP = (b'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
           b"<url><loc>http://a.test/x</loc></url></urlset>")


def crawler(
    patience: int = 5, level: int = 0, last: float = -1e9, until: float = 0.0
) -> OriginCrawler:
    state = OriginState("http://a.test", backoff_level=level, backoff_until=until)
    made = OriginCrawler("http://a.test", state, patience=patience)
    made.backoff_ends = last
    return made


def response(status: int, body: bytes = b"", **headers: str) -> HttpResponse:
    return HttpResponse(URL, status, {k.replace("_", "-"): v for k, v in headers.items()}, body,
                        0.01)


def read(result: HttpResponse | FetchError, origin: OriginCrawler | None = None,
         conditional: bool = True) -> outcome.Reading:
    return outcome.read(URL, result, origin or crawler(), CONFIG, NOW, WALL, 1.0,
                        conditional=conditional)


@pytest.mark.parametrize(
    ("resp", "code", "step", "detail"),
    [
        (response(200, b"<p>", content_type="text/html"), ExitCode.OK, Next.PAGE, None),
        (response(200, b"<p>"), ExitCode.OK, Next.PAGE, None),  # no type: read as HTML
        (response(200, b"<p>", content_type="application/xhtml+xml"), ExitCode.OK, Next.PAGE,
         None),
        (response(200, b"%PDF", content_type="application/pdf"), ExitCode.UNSUPPORTED_CONTENT,
         Next.FILE, None),
        (response(200, SITEMAP, content_type="application/xml"), ExitCode.UNSUPPORTED_CONTENT,
         Next.SITEMAP, None),
        (response(304), ExitCode.NOT_MODIFIED, Next.NOTHING, None),
        (response(404), ExitCode.HTTP_CLIENT_ERROR, Next.NOTHING, None),
        (response(410), ExitCode.HTTP_CLIENT_ERROR, Next.NOTHING, None),
        (response(500), ExitCode.HTTP_SERVER_ERROR, Next.NOTHING, "backed off 1.0s"),
        (response(502), ExitCode.HTTP_SERVER_ERROR, Next.NOTHING, "backed off 1.0s"),
        (response(600), ExitCode.PROTOCOL_ERROR, Next.NOTHING, "unexpected status 600"),
        (response(300), ExitCode.PROTOCOL_ERROR, Next.NOTHING, "unexpected status 300"),
        (response(101), ExitCode.PROTOCOL_ERROR, Next.NOTHING, "unexpected status 101"),
        (response(301), ExitCode.REDIRECT, Next.NOTHING, "no usable Location (none): not queued"),
        (response(302, location="javascript:x"), ExitCode.REDIRECT, Next.NOTHING,
         "no usable Location (javascript:x): not queued"),
    ],
)
def test_a_response_reads_as_its_exit_code(
    resp: HttpResponse, code: ExitCode, step: Next, detail: str | None
) -> None:
    reading = read(resp)
    assert (reading.exit_code, reading.next, reading.detail) == (code, step, detail)
    assert (reading.pause is None) is (code is not ExitCode.HTTP_SERVER_ERROR)  # backing off


def test_a_304_answers_a_conditional_request_only() -> None:
    reading = read(response(304), conditional=False)
    assert (reading.exit_code, reading.detail) == (
        ExitCode.PROTOCOL_ERROR, "304 Not Modified to a request without validators")


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_names_its_normalized_target(status: int) -> None:
    reading = read(response(status, location=" ../b/./c#top "))
    assert (reading.exit_code, reading.next) == (ExitCode.REDIRECT, Next.REDIRECT)
    assert reading.redirect_target == "http://a.test/b/c"


@pytest.mark.parametrize(
    ("status", "retry_after", "level", "last", "pause", "new_level"),
    [
        (429, "7", 0, -1e9, 7.0, 1),  # Retry-After in seconds
        (503, "7000", 0, -1e9, 600.0, 1),  # capped at retry_after_cap
        (429, "Fri, 15 Jan 2027 08:00:10 GMT", 0, -1e9, 10.0, 1),  # an HTTP date
        (503, "", 0, -1e9, 1.0, 1),  # no Retry-After: backoff_base × 2^0
        (503, "", 3, NOW - 10, 8.0, 4),  # a recent rate limit: the level climbs
        (503, "", 3, NOW - 61, 1.0, 1),  # a quiet minute: forgiven
        (429, "", 12, NOW - 1, 300.0, 13),  # at most backoff_max
    ],
)
def test_a_rate_limit_pauses_the_origin(
    status: int, retry_after: str, level: int, last: float, pause: float, new_level: int
) -> None:
    headers = {"retry_after": retry_after} if retry_after else {}
    origin = crawler(level=level, last=last)
    reading = read(response(status, **headers), origin)
    assert reading.exit_code is ExitCode.RATE_LIMITED
    assert reading.pause == pytest.approx(pause)
    assert reading.backoff_level == new_level
    capped = " (Retry-After 7000s capped)" if retry_after == "7000" else ""
    assert reading.detail == f"paused {reading.pause:.1f}s{capped}"
    assert (origin.state.backoff_level, origin.backoff_ends) == (level, last)  # untouched


@pytest.mark.parametrize(("code", "backs_off"), [
    (ExitCode.TIMEOUT, True), (ExitCode.NETWORK_ERROR, True), (ExitCode.PROTOCOL_ERROR, True),
    (ExitCode.TOO_LARGE, False), (ExitCode.BLOCKED_ADDRESS, False),
])
def test_a_fetch_error_keeps_its_exit_code_and_detail(code: ExitCode, backs_off: bool) -> None:
    reading = read(FetchError(code, "what happened"))
    assert (reading.exit_code, reading.detail, reading.next) == (code, "what happened",
                                                                 Next.NOTHING)
    assert (reading.pause, reading.backoff_level) == ((1.0, 1) if backs_off else (None, 0))


@pytest.mark.parametrize(
    ("result", "level", "last", "pause", "new_level"),
    [
        (response(500), 0, -1e9, 1.0, 1),
        (response(502), 2, NOW - 5, 4.0, 3),  # failing in a row: the backoff doubles
        (FetchError(ExitCode.TIMEOUT, "t"), 3, NOW - 5, 8.0, 4),
        (FetchError(ExitCode.NETWORK_ERROR, "n"), 3, NOW - 61, 1.0, 1),  # a quiet minute
        (response(500), 12, NOW - 1, 300.0, 13),  # at most backoff_max
    ],
)
def test_a_failing_server_backs_the_origin_off(
    result: HttpResponse | FetchError, level: int, last: float, pause: float, new_level: int
) -> None:
    reading = read(result, crawler(level=level, last=last))
    assert (reading.pause, reading.backoff_level) == (pytest.approx(pause), new_level)


def action(code: ExitCode, status: int | None = None, attempts: int = 0) -> CrawlAction:
    candidate = Candidate(1, URL, 0, attempts=attempts)
    return CrawlAction(candidate, "http://a.test", code, WALL, http_status=status, detail="d")


DAY = 86400.0


@pytest.mark.parametrize(
    ("code", "status", "attempts", "patience", "retry", "state", "interval"),
    [
        (ExitCode.OK, 200, 0, 5, False, LinkState.CRAWLED, 7 * DAY),
        (ExitCode.NOT_MODIFIED, 304, 0, 5, False, LinkState.CRAWLED, 7 * DAY),
        (ExitCode.REDIRECT, 301, 0, 5, False, LinkState.CRAWLED, 7 * DAY),
        (ExitCode.HTTP_CLIENT_ERROR, 404, 0, 5, False, LinkState.ERROR, DAY),
        (ExitCode.HTTP_SERVER_ERROR, 500, 0, 2, False, LinkState.ERROR, DAY),
        (ExitCode.RATE_LIMITED, 429, 0, 3, True, LinkState.QUEUED, None),  # patience kept
        (ExitCode.RATE_LIMITED, 429, 2, 3, False, LinkState.ERROR, DAY),  # out of retries
        (ExitCode.TIMEOUT, None, 0, 2, True, LinkState.QUEUED, None),
        (ExitCode.NETWORK_ERROR, None, 1, 2, True, LinkState.QUEUED, None),
        (ExitCode.NETWORK_ERROR, None, 2, 2, False, LinkState.ERROR, DAY),  # 3 requests in all
        (ExitCode.PROTOCOL_ERROR, None, 0, 2, False, LinkState.ERROR, DAY),
        (ExitCode.INTERNAL_ERROR, 200, 0, 2, False, LinkState.ERROR, DAY),
        (ExitCode.TOO_LARGE, None, 0, 3, False, LinkState.ERROR, DAY),  # no status: unchanged
        (ExitCode.BLOCKED_BY_ROBOTS_TXT, None, 0, 3, False, LinkState.CRAWLED, 1800.0),
        (ExitCode.BLOCKED_URL_BY_LOCAL_POLICY, None, 0, 3, False, LinkState.CRAWLED, 90 * DAY),
    ],
)
def test_settling_an_action(
    code: ExitCode, status: int | None, attempts: int, patience: int, retry: bool,
    state: LinkState, interval: float | None,
) -> None:
    origin = crawler(patience=3)
    settled = outcome.settle(action(code, status, attempts), origin, CONFIG)
    assert (settled.patience, settled.retry, settled.link_state) == (patience, retry, state)
    assert settled.recrawl_interval == interval
    assert origin.patience == 3  # untouched: the crawl loop applies the decision


def test_an_error_that_costs_patience_says_so_and_an_answer_forgives() -> None:
    origin = crawler(patience=1)
    earlier = Ending(EndKind.ROBOTS_UNAVAILABLE, "earlier")
    origin.ending = earlier
    settled = outcome.settle(action(ExitCode.TIMEOUT), origin, CONFIG)
    assert settled.patience == 0
    assert settled.ending == Ending(EndKind.OUT_OF_PATIENCE, "out of patience after TIMEOUT: d")
    settled = outcome.settle(action(ExitCode.HTTP_CLIENT_ERROR, 404), origin, CONFIG)
    assert (settled.patience, settled.ending) == (5, None)
    settled = outcome.settle(action(ExitCode.TOO_LARGE), origin, CONFIG)
    assert (settled.patience, settled.ending) == (1, earlier)


@pytest.mark.parametrize(
    ("code", "status", "reset"),
    [
        (ExitCode.OK, 200, True),
        (ExitCode.HTTP_CLIENT_ERROR, 404, True),  # the server answered: not failing
        (ExitCode.HTTP_SERVER_ERROR, 500, False),  # the server failed: backing off
        (ExitCode.RATE_LIMITED, 429, False),  # still paused
        (ExitCode.INTERNAL_ERROR, 200, False),  # handling the answer failed
        (ExitCode.TIMEOUT, None, False),  # no answer
    ],
)
def test_an_answer_ends_the_origins_backoff(code: ExitCode, status: int | None,
                                            reset: bool) -> None:
    assert outcome.settle(action(code, status), crawler(until=WALL + 60), CONFIG).reset_backoff \
        is reset
    assert outcome.settle(action(code, status), crawler(level=2), CONFIG).reset_backoff is reset
    assert not outcome.settle(action(code, status), crawler(), CONFIG).reset_backoff


ROBOTS = rules_for_status(200, b"User-agent: *\nDisallow: /private\n", CONFIG.user_agent)
POLICY = Policy(Policies(do_not_crawl=["/private/keep", "/open/no"]), CONFIG.traps,
                ["http://a.test/"])


@pytest.mark.parametrize(
    ("path", "robots", "code"),
    [
        ("/open/yes", ROBOTS, None),
        ("/private/x", ROBOTS, ExitCode.BLOCKED_BY_ROBOTS_TXT),
        ("/private/x", None, None),  # robots.txt not fetched yet (or not obeyed)
        ("/open/no", ROBOTS, ExitCode.BLOCKED_URL_BY_LOCAL_POLICY),
        ("/private/keep", ROBOTS, ExitCode.BLOCKED_URL_BY_LOCAL_POLICY),  # policies come first
    ],
)
def test_refusal_before_the_fetch(path: str, robots: object, code: ExitCode | None) -> None:
    refused = outcome.refusal("http://a.test" + path, 0, POLICY, robots)  # type: ignore[arg-type]
    assert (refused and refused.exit_code) == code
    if refused is not None:
        assert refused.rule


@pytest.mark.parametrize(
    ("etag", "modified", "headers"),
    [
        (None, None, None),
        ('"v1"', None, {"If-None-Match": '"v1"'}),
        (None, "Tue, 01 Dec 2026 00:00:00 GMT",
         {"If-Modified-Since": "Tue, 01 Dec 2026 00:00:00 GMT"}),
    ],
)
def test_a_conditional_get_sends_the_stored_validators(
    etag: str | None, modified: str | None, headers: dict[str, str] | None
) -> None:
    assert outcome.validators(Candidate(1, URL, 0, etag=etag, last_modified=modified)) == headers


@pytest.mark.parametrize(
    ("crawl_delay", "above_cap", "pages", "most", "kind"),
    [
        (None, "skip", 0, 0, None),
        (30.0, "skip", 0, 0, None),  # at the cap
        (31.0, "clamp", 0, 0, None),  # clamped to the cap
        (31.0, "skip", 0, 0, EndKind.CRAWL_DELAY),
        (None, "skip", 9, 10, None),
        (None, "skip", 10, 10, EndKind.TRAP),
        (31.0, "skip", 10, 10, EndKind.CRAWL_DELAY),  # the Crawl-delay is asked first
    ],
)
def test_an_origin_ends_before_its_work(
    crawl_delay: float | None, above_cap: str, pages: int, most: int, kind: EndKind | None
) -> None:
    config = CrawlConfig.model_validate({
        "politeness": {"crawl_delay_above_cap": above_cap},
        "traps": {"max_pages_per_origin": most},
    })
    origin = crawler()
    origin.state.crawl_delay, origin.pages_this_run = crawl_delay, pages
    ending = outcome.ending(origin, config)
    assert (ending and ending.kind) == kind


@pytest.mark.parametrize(("min_delay", "keep_alive", "reuse"),
                         [(0.5, 4.0, True), (4.0, 4.0, False), (30.0, 4.0, False)])
def test_a_connection_is_kept_only_when_the_next_request_may_reuse_it(
    min_delay: float, keep_alive: float, reuse: bool
) -> None:
    config = CrawlConfig.model_validate({"politeness": {"min_delay": min_delay},
                                         "limits": {"keep_alive": keep_alive}})
    assert outcome.keeps_alive(crawler(), config) is reuse


@pytest.mark.parametrize(
    ("headers", "stored", "kept"),
    [
        ({"etag": '"a"', "last-modified": LAST_MODIFIED}, None, ('"a"', LAST_MODIFIED)),
        ({}, None, (None, None)),  # a new body without validators: none kept
        ({"etag": '"b"'}, Candidate(1, URL, 0, etag='"a"', last_modified=LAST_MODIFIED),
         ('"b"', LAST_MODIFIED)),  # a 304 updates what it names, keeps the rest
        ({"last-modified": "yesterday"}, None, (None, None)),  # no HTTP-date
        ({"last-modified": "Thu, 01 Jan 2099 00:00:00 GMT"}, None, (None, None)),  # future
        ({"last-modified": LAST_MODIFIED, "date": "Tue, 20 Oct 2015 07:28:00 GMT"}, None,
         (None, None)),  # later than the response's Date
    ],
)
def test_the_validators_kept_from_a_response(
    headers: dict[str, str], stored: Candidate | None, kept: tuple[str | None, str | None]
) -> None:
    assert outcome.kept_validators(headers, WALL, stored) == kept


@pytest.mark.parametrize(("body", "kind"), [
    (b"\n\t <!doctype html><p>", "text/html"), (b"<HTML>", "text/html"),
    (b"<a href=x>", "text/html"), (b"<!-- c -->", "text/html"), (b"<br/>", "text/plain"),
    (b"<html", "text/plain"), (b"<?xml version='1.0'?>", "text/xml"),
    (b"%PDF-1.7\n\x00", "application/pdf"), (b"\xef\xbb\xbf<html>", "text/plain"),
    (b"plain words", "text/plain"), (b"GIF89a\x01\x00\x01\x00", "application/octet-stream"),
    (b"x" * 1445 + b"\x00", "text/plain"),  # a binary byte past the resource header
])
def test_a_body_without_a_type_is_sniffed_as_the_mime_sniffing_standard_says(
    body: bytes, kind: str
) -> None:
    assert sniff.sniffed(body) == kind
    assert sniff.content_type(None, body) == sniff.content_type("*/*", body) == kind
    assert sniff.content_type("application/octet-stream", body) == "application/octet-stream"
