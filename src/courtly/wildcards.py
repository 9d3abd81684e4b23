"""Many robots.txt wildcard patterns matched against one path at once, in bounded time.

A pattern ``s0*s1*…*sk`` (optionally ending in ``$``) matches a path that starts with ``s0`` and
holds ``s1`` … ``sk`` in that order: finding each part at its leftmost place after the previous
one is exact, since ``*`` is the only operator. robots.py hands small sets to one RE2 set; a set
too big for RE2 to compile quickly (a hostile robots.txt: 10,000 patterns of 20 wildcards took
RE2 0.8 s and matching them one by one in Python 32 ms) comes here. The patterns advance together,
one part a step, with numpy: a step costs a few array operations over the patterns still alive,
and the leftmost places come from a table of next occurrences (a few distinct parts) or one
``str.find`` per distinct (part, place) pair (many distinct parts), whichever is smaller.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["WildcardSet"]

Ints = npt.NDArray[np.int64]

#: at most this many entries in a per-path table of next occurrences (else: str.find per pair)
_TABLE_CELLS = 1_000_000
#: patterns still alive below this number finish in plain Python (no per-step array overhead)
_FEW = 8


class WildcardSet:
    """Patterns, each a tuple of literal parts between ``*``s, in order of precedence."""

    def __init__(self, patterns: Sequence[tuple[tuple[str, ...], bool]]) -> None:
        """``patterns``: (parts, anchored) pairs, the first that matches being the answer."""
        self._patterns = patterns
        size = len(patterns)
        heads = [segments[0] for segments, _ in patterns]
        self._firsts, self._first = _numbered(heads)
        self._first_lengths = sorted({len(s) for s in self._firsts}, reverse=True)
        self._first_lengths_of = np.fromiter(map(len, self._firsts), np.int64, len(self._firsts))
        # every part, the first ones included, in one list: '*' is never in a part (encoded)
        numbers, self._flat = _numbered("*".join("*".join(s) for s, _ in patterns).split("*"))
        self._parts = list(numbers)
        self._part_lengths = np.fromiter(map(len, self._parts), np.int64, len(self._parts))
        self._counts = np.fromiter((len(s) - 1 for s, _ in patterns), np.int64, size)
        self._offsets = np.cumsum(self._counts + 1) - self._counts  # of each one's second part
        self._anchored = np.fromiter((a for _, a in patterns), bool, size)

    def first_match(self, path: str, limit: int) -> int | None:
        """The index of the first of patterns[:limit] that matches ``path``, or None."""
        started = np.zeros(len(self._firsts), bool)
        for length in self._first_lengths:
            found = self._firsts.get(path[:length])
            if found is not None:
                started[found] = True
        alive = np.flatnonzero(started[self._first[:limit]])
        position = np.zeros(limit, np.int64)
        position[alive] = self._first_lengths_of[self._first[alive]]
        step = _Steps(path, self._parts, self._part_lengths)
        best: int | None = None
        j = 0
        while alive.size:
            if alive.size < _FEW:
                return self._finish(path, alive, position, j, best)
            counts = self._counts[alive]
            more = counts > j
            if not more.all():  # no part left: matched (anchored ones ended at the path's end)
                done = alive[~more]
                best = int(done.min()) if best is None else min(best, int(done.min()))
                alive, counts = alive[more], counts[more]
                alive, counts = alive[alive < best], counts[alive < best]
                if not alive.size:
                    break
            last = self._anchored[alive] & (counts == j + 1)
            pids = self._flat[self._offsets[alive] + j]
            after = step.next(pids, position[alive], last)
            keep = after >= 0
            alive = alive[keep]
            position[alive] = after[keep]
            j += 1
        return best

    def _finish(self, path: str, rows: Ints, position: Ints, j: int, best: int | None
                ) -> int | None:
        """The few patterns left, in plain Python from their part ``j`` on."""
        for row in sorted(int(r) for r in rows):
            if best is not None and row > best:
                break
            segments, anchored = self._patterns[row]
            if _rest_matches(path, segments, anchored, j + 1, int(position[row])):
                return row if best is None else min(best, row)
        return best


def _numbered(texts: list[str]) -> tuple[dict[str, int], Ints]:
    """A number for each distinct text (in order of appearance), and the texts as numbers."""
    numbers = {text: i for i, text in enumerate(dict.fromkeys(texts))}
    return numbers, np.fromiter(map(numbers.__getitem__, texts), np.int64, len(texts))


def _rest_matches(path: str, segments: tuple[str, ...], anchored: bool, start: int, at: int
                  ) -> bool:
    """Whether segments[start:] follow in order from ``at`` (the last one ending the path when
    anchored)."""
    last = len(segments) - 1
    for index in range(start, len(segments)):
        part = segments[index]
        if anchored and index == last:
            return len(path) - len(part) >= at and path.endswith(part)
        found = path.find(part, at)
        if found < 0:
            return False
        at = found + len(part)
    return not anchored or at == len(path)


class _Steps:
    """Where each (part, place) pair leads in one path: the end of the part's leftmost
    occurrence at or after the place, or -1."""

    def __init__(self, path: str, parts: list[str], lengths: Ints) -> None:
        self._path = path
        self._parts = parts
        self._lengths = lengths
        width = len(path) + 2
        tabled = len(parts) * width <= _TABLE_CELLS
        #: next-occurrence ends by part and place, filled a part at a time when first needed
        self._table = np.empty((len(parts), width) if tabled else (0, 0), np.int64)
        self._filled = np.zeros(len(parts) if tabled else 0, bool)

    def next(self, pids: Ints, places: Ints, last_anchored: npt.NDArray[np.bool_]) -> Ints:
        """The ends for these pairs (an anchored last part: the path's end if it ends so)."""
        path = self._path
        if last_anchored.any():
            out = np.full(pids.size, -1, np.int64)
            for row in np.flatnonzero(last_anchored).tolist():
                part = self._parts[int(pids[row])]
                if len(path) - len(part) >= places[row] and path.endswith(part):
                    out[row] = len(path)
            free = ~last_anchored
            out[free] = self.next(pids[free], places[free], last_anchored[free])
            return out
        if self._filled.size:
            missing = pids[~self._filled[pids]]
            for pid in np.unique(missing).tolist():
                self._fill(pid)
            return self._table[pids, places]
        keys = pids * (len(path) + 2) + places
        unique, back = np.unique(keys, return_inverse=True)
        found = np.empty(unique.size, np.int64)
        for i, key in enumerate(unique.tolist()):
            pid, place = divmod(key, len(path) + 2)
            at = path.find(self._parts[pid], place)
            found[i] = -1 if at < 0 else at + int(self._lengths[pid])
        return found[back]

    def _fill(self, pid: int) -> None:
        path, part = self._path, self._parts[pid]
        starts = []
        at = path.find(part)
        while at >= 0:
            starts.append(at)
            at = path.find(part, at + 1)
        row = self._table[pid]
        row.fill(-1)
        if starts:
            begins = np.array(starts, np.int64)
            index = np.searchsorted(begins, np.arange(row.size))
            inside = index < begins.size
            row[inside] = begins[index[inside]] + len(part)
        self._filled[pid] = True
