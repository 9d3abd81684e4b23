"""Scope, local crawl policies and trap guards: is this URL ours to crawl? (docs/urls.md).

`Policy.in_scope` is the hot path (every extracted link): it caches the answer per
"scheme://authority" prefix, so a call is a string slice and a dict lookup. `Policy.check` runs
the rules in the order documented under "Scope and policies" and returns the first refusal.

The do_not_crawl, deny and allow patterns are compiled together into RE2 sets (google-re2):
one match call per URL whatever the number of patterns, and the set reports which patterns
matched, so the verdict can name the rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote_plus

import re2

from courtly.patterns import compile_pattern, re2_options
from courtly.urls import authority_key, host_of, origin_of, registered_domain, split_url

if TYPE_CHECKING:
    from courtly.config import Policies, QueryParameters, Traps

__all__ = ["ALLOWED", "Policy", "ShapeBudget", "Verdict", "compile_pattern", "url_shape"]

# Above this many glob/regex patterns, a FilteredRE2 (literal prefilter, then only the candidate
# regexes) replaces the single RE2 set: one big set's DFA can thrash on many '*' patterns.
SET_LIMIT = 1000
_SCOPE_CACHE_SIZE = 65536


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of `Policy.check`: allowed or not, and the rule that decided."""

    allowed: bool
    rule: str


ALLOWED = Verdict(True, "allowed")


class _Matcher:
    """Patterns compiled into one RE2 set (plus a FilteredRE2 for more than SET_LIMIT globs and
    regexes, where literal prefixes stay in the set); `match` returns the indices hit."""

    def __init__(self, patterns: Sequence[str]) -> None:
        literal: list[tuple[int, str]] = []
        complex_: list[tuple[int, str]] = []
        for index, pattern in enumerate(patterns):
            regex, is_literal = compile_pattern(pattern)
            (literal if is_literal else complex_).append((index, regex))
        self._set_ids = [index for index, _ in literal]
        self._filter: Any = None
        self._filter_ids = [index for index, _ in complex_]
        if len(complex_) > SET_LIMIT:
            self._filter = re2.Filter()
            for _, regex in complex_:
                self._filter.Add("^" + regex, re2_options())
            self._filter.Compile()
        else:  # few enough: everything in one RE2 set, one match call per URL
            literal += complex_
            self._set_ids += self._filter_ids
            self._filter_ids = []
        self._set = self._build_set(literal)

    @staticmethod
    def _build_set(regexes: list[tuple[int, str]]) -> Any:
        if not regexes:
            return None
        matcher = re2.Set.MatchSet(re2_options())  # anchored at the start of the URL
        for _, regex in regexes:
            matcher.Add(regex)
        matcher.Compile()
        return matcher

    def match(self, url: str) -> list[int]:
        """Indices (into the pattern list) of every pattern that matches url."""
        hits: list[int] = []
        text = url.encode()
        if self._set is not None:
            found = self._set.Match(text)
            if found:
                ids = self._set_ids
                hits.extend(ids[i] for i in found)
        if self._filter is not None:
            found = self._filter.Match(text)
            if found:
                ids = self._filter_ids
                hits.extend(ids[i] for i in found)
        return hits


@dataclass(frozen=True, slots=True)
class _QueryRule:
    path_prefix: str
    combos: frozenset[frozenset[str]]
    rule: str


def _query_rule(entry: QueryParameters) -> _QueryRule:
    """One url_query_parameters entry → a compiled rule with its reason text."""
    prefix = entry.path_prefix
    combos = frozenset(frozenset(names) for names in entry.allow)
    shown = ", ".join(sorted("{" + ",".join(sorted(c)) + "}" for c in combos)) or "no parameters"
    return _QueryRule(prefix, combos, f"url_query_parameters: {prefix} allows {shown}")


def _split(url: str) -> tuple[str, str]:
    """(path, query) of an absolute URL ("/" and "" when absent)."""
    _, _, path, query, _ = split_url(url)
    return path or "/", query or ""


def _param_names(query: str) -> list[str]:
    """Parameter names of a query string, in order, duplicates kept, empty pairs skipped."""
    names = []
    for pair in query.split("&"):
        if pair:
            name = pair.split("=", 1)[0]
            names.append(unquote_plus(name) if "%" in name or "+" in name else name)
    return names


_DIGITS = re.compile(r"[0-9]+")
#: a whole run of 12 or more base64url characters with a capital letter or a digit in it (a run
#: of lower-case words and '-'/'_' is no token: the lookahead skips it without a Python call; the
#: lookbehind starts a match only where a run starts, so a long run is scanned once, not n times)
_RUN = re.compile(r"(?<![A-Za-z0-9_-])(?=[a-z_-]*[A-Z0-9])[A-Za-z0-9_-]{12,}")
#: 12 letters and digits or more, with both (ASP.NET's cookieless /(S(25lyr4i1e9yzcvg348zpimms))/,
#: a hash): an opaque token; a word or a number is not one
_ALNUM = re.compile(r"[A-Za-z0-9]{12,}")
#: where a run turns, not as words do: lower to upper case (a capital starting a word is no turn,
#: nor is an acronym's run of capitals), letter to digit and back
_TURN = re.compile(r"[a-z](?=[A-Z])|[A-Z](?=[A-Z][a-z])|[A-Za-z](?=[0-9])|[0-9](?=[A-Za-z])")


def _alnum_token(match: re.Match[str]) -> str:
    run = match.group()
    return run if run.isdigit() or run.isalpha() else "{t}"


def _random(run: str) -> bool:
    """Whether a run of 16 or more characters turns at least once every 4 (a random base64url
    token, /s/AbCdEfGhIjKlMnOpQrStUv/: 94 % of random letters, 99 % of base64url); CamelCase
    turns once a word (/WikiPageName/), an acronym not at all (/HTTPSConnectionPool/)."""
    return len(run) >= 16 and len(_TURN.findall(run)) * 4 >= len(run)


def _token(match: re.Match[str]) -> str:
    run = match.group()
    plain = run.isalnum()  # no '-' or '_'
    if plain and not run.isalpha():
        return run if run.isdigit() else "{t}"  # letters and digits: a hash, a session id
    if _random(run):
        return "{t}"  # AbCdEfGhIjKlMnOpQrStUv, base64url's Zm9vYmFyYmF6cXV4cXV1eA-_
    return run if plain else _ALNUM.sub(_alnum_token, run)  # a slug's token abstracted alone


def url_shape(url: str) -> str:
    """The URL's path and query with opaque tokens, digit runs (so dates too) and query values
    abstracted: /cal/2026/11/?view=week → /cal/{n}/{n}/?view={v}, /(S(25lyr4i1e9yzcvg348zpimms))/a
    → /(S({t}))/a, /s/AbCdEfGhIjKlMnOpQrStUv/page → /s/{t}/page. One shape, many URLs: a trap's
    signature."""
    path, query = _split(url)
    shape = _DIGITS.sub("{n}", _RUN.sub(_token, path))
    if query:
        shape += "?" + "&".join(f"{name}={{v}}" for name in _param_names(query))
    return shape


@dataclass(slots=True)
class ShapeBudget:
    """One origin's crawl actions this run per URL shape that keeps reappearing deeper in the link
    graph (a calendar's or a counter's pages are found ever deeper, a catalogue's at a few
    depths), and per path whose query only recombines values already seen (a faceted search).

    A URL more than `slack` links deeper than the shallowest URL of its shape crawled in this
    run costs one action of its shape's budget (`limit`); once that is spent it is refused. A
    URL of two query parameters or more that brings no value new to its path (`?color=red&size=m`
    once red and m were seen there) costs one of its path's `recombinations`: a search's filters
    and orders multiply into thousands of URLs of a few values, a catalogue's ids are new.
    """

    limit: int
    slack: int = 0
    recombinations: int = 0
    #: shape → [the shallowest depth crawled, the actions spent below depth + slack]
    shapes: dict[str, list[int]] = field(default_factory=dict)
    #: path → (each query parameter's values seen, [the URLs that only recombined them])
    queries: dict[str, tuple[dict[str, set[str]], list[int]]] = field(default_factory=dict)

    def spend(self, url: str, depth: int) -> Verdict:
        """Count a crawl action of url (found at link depth `depth`); refuse it once spent."""
        verdict = self._recombined(url)
        if not verdict.allowed or not self.limit:
            return verdict
        shape = url_shape(url)
        seen = self.shapes.get(shape)
        if seen is None:
            self.shapes[shape] = [depth, 0]
            return ALLOWED
        if depth <= seen[0] + self.slack:
            seen[0] = min(seen[0], depth)
            return ALLOWED
        if seen[1] >= self.limit:
            return Verdict(False, f"trap: max_actions_per_shape {self.limit} spent on {shape}")
        seen[1] += 1
        return ALLOWED

    def _recombined(self, url: str) -> Verdict:
        if not self.recombinations:
            return ALLOWED
        path, query = _split(url)
        pairs = parse_qsl(query, keep_blank_values=True)
        if len(pairs) < 2:
            return ALLOWED
        seen, spent = self.queries.setdefault(path, ({}, [0]))
        novel = False
        for name, value in pairs:
            values = seen.setdefault(name, set())
            if value not in values:
                novel = True
                if len(values) < _MAX_VALUES:  # past it, an id: its values are all new
                    values.add(value)
        if novel:
            return ALLOWED
        if spent[0] >= self.recombinations:
            return Verdict(False, f"trap: max_query_recombinations {self.recombinations} spent "
                                  f"on {path}?{'&'.join(f'{n}={{v}}' for n in sorted(seen))}")
        spent[0] += 1
        return ALLOWED


#: a query parameter's values one path's recombination budget remembers (ShapeBudget)
_MAX_VALUES = 10_000


class Policy:
    """Scope, do_not_crawl, allow/deny, url_query_parameters and trap guards for one crawl."""

    def __init__(self, policies: Policies, traps: Traps, seeds: Iterable[str]) -> None:
        """Derive the scope from the seeds (absolute URLs) and compile every rule."""
        self.scope = policies.scope
        self.traps = traps
        self.rescope(seeds)
        self._lists = (
            [("do_not_crawl", p) for p in policies.do_not_crawl]
            + [("deny", p) for p in policies.deny]
            + [("allow", p) for p in policies.allow]
        )
        self._matcher = _Matcher([p for _, p in self._lists])
        self._has_allow = bool(policies.allow)
        self._query_rules = [_query_rule(e) for e in policies.url_query_parameters]

    def rescope(self, seeds: Iterable[str]) -> None:
        """The scope of these seeds (absolute URLs) from now on (a fleet's seeds were added)."""
        origins, hosts = set(), set()
        for seed in seeds:
            try:
                origins.add(origin_of(seed))
                hosts.add(host_of(seed))
            except ValueError:
                continue
        self.origins, self.hosts = frozenset(origins), frozenset(hosts)
        self.domains: frozenset[str] = frozenset()
        if self.scope == "domain":  # the public suffix list loads on first use: only if needed
            self.domains = frozenset(registered_domain(h) for h in hosts)
        self._scope_cache: dict[str, str | None] = {}

    def _origin_in_scope(self, url: str) -> str | None:
        """The URL's origin if it is in scope, else None (uncached)."""
        try:
            origin = origin_of(url)
            if self.scope == "origin":
                return origin if origin in self.origins else None
            host = host_of(url)
        except ValueError:
            return None
        if self.scope == "host":
            in_scope = host in self.hosts
        elif self.scope == "subdomains":
            in_scope = host in self.hosts
            dot = host.find(".")
            while not in_scope and dot >= 0:
                in_scope = host[dot + 1 :] in self.hosts
                dot = host.find(".", dot + 1)
        else:
            in_scope = registered_domain(host) in self.domains
        return origin if in_scope else None

    def origin_for(self, url: str) -> str | None:
        """The origin crawler url belongs to ("scheme://host:port"), or None if out of scope.

        With scope "origin" that is the URL's origin when it is a seed origin; with a wider
        scope it is the URL's own origin, so each origin discovered in scope gets its crawler.
        """
        key = authority_key(url)
        cache = self._scope_cache
        origin = cache.get(key, "")
        if origin != "":
            return origin
        origin = self._origin_in_scope(url)
        if len(cache) >= _SCOPE_CACHE_SIZE:
            cache.clear()  # bounded memory: many authorities is rare, recomputing is cheap
        cache[key] = origin
        return origin

    def in_scope(self, url: str) -> bool:
        """Whether url is inside the crawl scope (cached per scheme://authority)."""
        slash = url.find("/", url.find("://") + 3)  # inlined authority_key: the hot path
        origin = self._scope_cache.get(url[:slash] if slash > 0 else url, "")
        if origin == "":
            origin = self.origin_for(url)
        return origin is not None

    def check(self, url: str, depth: int) -> Verdict:
        """The first rule refusing url (found at link depth `depth` from a seed), or ALLOWED.

        Order: scope, max_url_length, do_not_crawl, deny, allow, url_query_parameters,
        max_query_params, max_path_depth, max_segment_repeats, max_depth.
        """
        traps = self.traps
        if not self.in_scope(url):
            return Verdict(False, f"scope: not in {self.scope}")
        if traps.max_url_length and len(url) > traps.max_url_length:
            return Verdict(False, f"trap: max_url_length {traps.max_url_length}")
        if self._lists:
            verdict = self._check_patterns(url)
            if verdict is not None:
                return verdict
        path, query = _split(url)
        names = _param_names(query) if query else []
        if names and self._query_rules:
            verdict = self._check_query(path, names)
            if verdict is not None:
                return verdict
        if traps.max_query_params and len(names) > traps.max_query_params:
            return Verdict(False, f"trap: max_query_params {traps.max_query_params}")
        if traps.max_path_depth or traps.max_segment_repeats:
            segments = path[1:].split("/")
            if "" in segments:  # a trailing or doubled slash: empty segments do not count
                segments = [s for s in segments if s]
            if traps.max_path_depth and len(segments) > traps.max_path_depth:
                return Verdict(False, f"trap: max_path_depth {traps.max_path_depth}")
            limit = traps.max_segment_repeats
            if limit and len(segments) > limit:
                distinct = set(segments)
                if len(distinct) < len(segments) and max(map(segments.count, distinct)) > limit:
                    return Verdict(False, f"trap: max_segment_repeats {limit}")
        if traps.max_depth and depth > traps.max_depth:
            return Verdict(False, f"trap: max_depth {traps.max_depth}")
        return ALLOWED

    def _check_patterns(self, url: str) -> Verdict | None:
        """do_not_crawl, then deny (deny wins over allow), then the allow list."""
        hits = self._matcher.match(url)
        if hits:
            hits.sort()  # the lists are concatenated in check order: first hit decides
            kind, pattern = self._lists[hits[0]]
            if kind != "allow":
                return Verdict(False, f"{kind}: {pattern}")
            return None
        if self._has_allow:
            return Verdict(False, "allow: no allow pattern matches")
        return None

    def _check_query(self, path: str, names: list[str]) -> Verdict | None:
        """Refuse when some rule covers the path and no covering rule allows these names."""
        covering: _QueryRule | None = None
        name_set = frozenset(names)
        for rule in self._query_rules:
            if path.startswith(rule.path_prefix):
                if name_set in rule.combos:
                    return None
                covering = covering or rule
        return None if covering is None else Verdict(False, covering.rule)
