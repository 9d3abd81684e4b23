"""When a crawl candidate is due again, from its exit code category and whether it changed.

The interval of a page with content starts at `recrawl.ok`; with `recrawl.adaptive` it shrinks
(× `changed_factor`) each time the content changed and grows (× `unchanged_factor`) each time it did
not (304, the same fingerprint, or a page's text a near-duplicate of its last version's), within
[`min_interval`, `max_interval`]. Errors start at `recrawl.error` and back off (× `error_backoff`)
while they repeat. A URL blocked by robots.txt is due when robots.txt expires. See
docs/recrawl.md.
"""

from __future__ import annotations

from courtly.config import Recrawl, Robots
from courtly.model import Candidate, CrawlAction, ExitCode

_BLOCKED = frozenset({ExitCode.BLOCKED_BY_ROBOTS_TXT})
_MOVED = frozenset({ExitCode.REDIRECT, ExitCode.NOT_CANONICAL})
_UNCHANGED = frozenset({ExitCode.NOT_MODIFIED})
_CONTENT = frozenset(
    {ExitCode.OK, ExitCode.NOINDEX, ExitCode.DUPLICATE_CONTENT, ExitCode.UNSUPPORTED_CONTENT,
     ExitCode.NOT_MODIFIED}
)
_LOCAL = frozenset({ExitCode.BLOCKED_URL_BY_LOCAL_POLICY, ExitCode.BLOCKED_BY_TRAP_BUDGET})
_NOT_ERRORS = _CONTENT | _BLOCKED | _MOVED | _LOCAL


def _clamp(value: float, rules: Recrawl) -> float:
    return max(rules.min_interval, min(rules.max_interval, value))


def changed(action: CrawlAction, candidate: Candidate) -> bool | None:
    """Whether the content changed since the last crawl (None: nothing to compare): a new
    fingerprint, unless the page's text is a near-duplicate of its last version's (a timestamp
    or a token changed: content.py judged it)."""
    if action.exit_code in _UNCHANGED:
        return False
    if action.content_hash is None or candidate.content_hash is None:
        return None
    return action.content_hash != candidate.content_hash and not action.similar_to_last


def _previous(candidate: Candidate, codes: frozenset[ExitCode]) -> float | None:
    """The last interval, if the last crawl action was in the same category."""
    if candidate.recrawl_interval is None or candidate.exit_code is None:
        return None
    try:
        code = ExitCode(candidate.exit_code)
    except ValueError:
        return None
    return candidate.recrawl_interval if code in codes else None


def interval(action: CrawlAction, candidate: Candidate, rules: Recrawl, robots: Robots) -> float:
    """Seconds until the URL is due again."""
    code = action.exit_code
    if code is ExitCode.ORIGIN_GIVEN_UP:
        return 0.0  # never fetched: the next run takes it again
    if code in _BLOCKED:
        return max(robots.expiry, rules.blocked)
    if code in _LOCAL:
        return rules.max_interval
    if code in _MOVED:
        return rules.redirect
    if code not in _CONTENT:
        last = _previous(candidate, frozenset(ExitCode) - _NOT_ERRORS)
        if last is None or not rules.adaptive:
            return rules.error
        return min(rules.max_interval, max(rules.error, last * rules.error_backoff))
    if not rules.adaptive:
        return rules.ok
    last = _previous(candidate, _CONTENT)
    change = changed(action, candidate)
    if last is None or change is None:
        return _clamp(rules.ok, rules)
    factor = rules.changed_factor if change else rules.unchanged_factor
    return _clamp(last * factor, rules)


def next_due(action: CrawlAction, candidate: Candidate, rules: Recrawl, robots: Robots) -> float:
    """The wall-clock time at which the candidate is due again (sets action.recrawl_interval)."""
    action.recrawl_interval = interval(action, candidate, rules, robots)
    return action.started + action.recrawl_interval
