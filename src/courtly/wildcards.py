"""robots.txt wildcard patterns matched against one path, in time bounded by the patterns.

A pattern ``s0*s1*…*sk`` (``$`` at the end: anchored) matches a path that starts with ``s0`` and
holds ``s1`` … ``sk`` in that order: taking each part at its leftmost place after the previous
one is exact, since ``*`` is the only operator. So a match costs at most a search per part, and
nothing built per path can grow with the paths seen (RE2's lazily built DFA, used before, cost
up to 5 ms a new path for 30 wildcard rules, 170 ms for 95 rules of 20 wildcards).

A few hundred patterns (any usual file) are walked one by one with ``bytes.find``, in order of
precedence, behind one RE2 search for the literals they need: `Walk`. More (issue 26's hostile
file: 10,000 patterns of 20 wildcards) advance together in numpy: wildcard_groups.py, which
robots.py imports only then (the crawl process does not load numpy otherwise). ``cost``
estimates a match's worst case.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from typing import Protocol

import re2

from courtly.patterns import re2_options

__all__ = ["Matcher", "Walk"]

# Seconds of CPU, measured on the shared 2-core machine under a load of 6 (cost's estimates):
_WALK_PATTERN = 0.5e-6  # a pattern walked in Python, each part it gets to, each octet searched
_WALK_PART = 0.2e-6
_WALK_OCTET = 0.1e-9


class Matcher(Protocol):
    """Patterns in order of precedence, as robots.py normalises them: literal parts between
    ``*``s (at least one ``*``), a final ``$`` when anchored (a literal ``$`` is ``%24``)."""

    def first_match(self, path: str, limit: int) -> int | None:
        """The index of the first of patterns[:limit] that matches ``path``, or None."""

    def cost(self, length: int) -> float:
        """An estimate of the CPU seconds a match of a path of ``length`` octets takes at worst
        (every pattern alive as long as it can be: a part advances at least one octet)."""


class Walk:
    """Patterns walked one by one: (row, parts; an anchored last one ends with '$')."""

    @classmethod
    def of(cls, patterns: Sequence[str]) -> Walk:
        """Patterns as Matcher says, in order."""
        return cls([(row, pattern.encode("utf-8", "surrogateescape").split(b"*"))
                    for row, pattern in enumerate(patterns)])

    def __init__(self, patterns: list[tuple[int, list[bytes]]]) -> None:
        self._all = sorted(patterns, key=lambda pattern: pattern[0])
        # Most need a part after the first somewhere in the path (the longest): one RE2 search
        # for any of those (literals only: a DFA of at most their octets' states) skips them all
        # in the usual case, where none is there; the others are walked anyway.
        needed = [max(parts[1:], key=len).removesuffix(b"$") for _, parts in self._all]
        self._bare = [pattern for pattern, part in zip(self._all, needed, strict=True)
                      if not part]
        self._screen: re2._Regexp | None = None
        if len(self._bare) < len(self._all):
            try:
                self._screen = re2.compile(b"|".join(map(re2.escape, set(filter(None, needed)))),
                                           re2_options())
            except re2.error:  # over RE2's memory budget: all walked
                self._bare = self._all
        self._fixed = sum(_WALK_PATTERN + _WALK_PART * len(parts) for _, parts in self._all)
        self._octet = _WALK_OCTET * len(self._all)

    def cost(self, length: int) -> float:
        """See Matcher.cost."""
        return self._fixed + self._octet * length

    def first_match(self, path: str, limit: int) -> int | None:
        """See Matcher.first_match."""
        found = self.first(path.encode("utf-8", "surrogateescape"), limit)
        return found if found < limit else None

    def first(self, data: bytes, limit: int) -> int:
        """The first row below ``limit`` that matches ``data``, else ``limit``."""
        screened = self._screen is not None and self._screen.search(data) is None
        for row, parts in self._bare if screened else self._all:
            if row >= limit:
                break
            if _matches(data, parts):
                return row
        return limit


def _matches(data: bytes, parts: list[bytes]) -> bool:
    """Whether ``data`` starts with parts[0] and holds the others in order (an anchored last
    one, written with '$', ending it)."""
    if not data.startswith(parts[0]):
        return False
    at = len(parts[0])
    for part in islice(parts, 1, len(parts) - 1):
        at = data.find(part, at)
        if at < 0:
            return False
        at += len(part)
    last = parts[-1]
    if last.endswith(b"$"):
        return len(data) - len(last) + 1 >= at and data.endswith(last[:-1])
    return data.find(last, at) >= 0
