"""When a crawl candidate is due again, from its exit code category and whether it changed."""

from __future__ import annotations

from courtly.config import Recrawl, Robots
from courtly.model import Candidate, CrawlAction, ExitCode

_BLOCKED = frozenset({ExitCode.BLOCKED_BY_ROBOTS_TXT})
_REDIRECTS = frozenset({ExitCode.REDIRECT, ExitCode.NOT_CANONICAL})
_UNCHANGED = frozenset({ExitCode.NOT_MODIFIED})
_CONTENT = frozenset(
    {ExitCode.OK, ExitCode.NOINDEX, ExitCode.DUPLICATE_CONTENT, ExitCode.UNSUPPORTED_CONTENT,
     ExitCode.NOT_MODIFIED}
)


def interval(action: CrawlAction, candidate: Candidate, rules: Recrawl, robots: Robots) -> float:
    """Seconds until the URL is due again."""
    code = action.exit_code
    if code in _BLOCKED:
        return robots.expiry
    if code is ExitCode.BLOCKED_URL_BY_LOCAL_POLICY:
        return rules.max_interval
    if code in _REDIRECTS:
        return rules.redirect
    if code not in _CONTENT:
        return rules.error
    return rules.ok


def next_due(action: CrawlAction, candidate: Candidate, rules: Recrawl, robots: Robots) -> float:
    """The wall-clock time at which the candidate is due for a recrawl."""
    return action.started + interval(action, candidate, rules, robots)
