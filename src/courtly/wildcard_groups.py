"""Many robots.txt wildcard patterns matched together in numpy (wildcards.py hands them over).

Patterns with about as many parts form a group, padded in front with the empty part, and advance
together, a part a step. Per path, one table says where each part next ends from each place (all
places of all parts found at once by a binary search of the path's windows among the parts of
each length), and a step is one gather from it for the whole group. Groups of a few patterns are
left to a `Walk`. :meth:`WildcardSet.cost` estimates a match's worst case.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

import numpy as np
import numpy.typing as npt

from courtly.wildcards import Walk

__all__ = ["WildcardSet"]

Ints = npt.NDArray[np.intp]

#: groups of fewer patterns than this are walked in plain Python (no per-step array overhead)
_FEW = 32
#: at most this many cells in the per-path table of next places (else: binary search per step)
_CELLS = 1 << 20
#: the low 0 to 8 octets of a little-endian 64-bit integer
_LOW_OCTETS = np.array([(1 << 8 * n) - 1 for n in range(9)], np.uint64)
#: a group's patterns are checked for life every this many steps (each part advances a place)
_CHECK = 16
# Seconds of CPU, measured on the shared 2-core machine under a load of 6 (cost's estimates):
_PLACES = 60e-6  # the table of next places: fixed, a part length and octet, a cell
_PLACES_OCTET = 25e-9
_CELL = 2e-9
_GROUP_PATTERN = 8e-9  # a pattern of a group: first part, result
_STEP = 4e-6  # a step of a group, and each of its patterns (binary search: table too big)
_STEP_PATTERN = 2e-9
_SEARCHED = 40e-9


class WildcardSet:
    """Patterns in order of precedence, as robots.py normalises them: literal parts between
    ``*``s (at least one ``*``), a final ``$`` when anchored (a literal ``$`` is ``%24``)."""

    def __init__(self, patterns: Sequence[str]) -> None:
        """``patterns``: the first that matches is the answer."""
        counts = np.fromiter(map(str.count, patterns, repeat("*")), np.intp, len(patterns))
        # every part, then an empty one (it pads patterns to a shared number of steps)
        texts, flat = _numbered("*".join(patterns).encode("utf-8", "surrogateescape") + b"*")
        firsts = np.cumsum(counts + 1) - (counts + 1)  # index of each pattern's first part
        self._texts = texts
        self._empty = int(flat[-1])
        few: list[tuple[int, list[bytes]]] = []  # (row, parts) of the groups of a few
        #: patterns walked together: rows (ascending), then their parts' numbers a step a row
        self._groups: list[tuple[Ints, Ints]] = []
        for rows in _grouped(counts):
            if rows.size >= _FEW:
                self._groups.append((rows, self._steps(flat, firsts, counts, rows)))
                continue
            for row in rows.tolist():
                numbers = flat[firsts[row]: firsts[row] + counts[row] + 1].tolist()
                few.append((row, [texts[n] for n in numbers]))
        self._few = Walk(few)
        self._groups.sort(key=lambda group: int(group[0][0]))
        self._heads: dict[bytes, int] = {}
        self._plain: list[tuple[int, npt.NDArray[np.bytes_], Ints]] = []
        self._ends: dict[int, dict[bytes, int]] = {}
        if self._groups:
            self._index(flat[firsts[np.concatenate([rows for rows, _ in self._groups])]])
        self._head_lengths = sorted({len(head) for head in self._heads}, reverse=True)
        self._head_size = np.fromiter(map(len, texts), np.intp, len(texts))
        self._head_of = flat[firsts]

    def _steps(self, flat: Ints, firsts: Ints, counts: Ints, rows: Ints) -> Ints:
        """A group's parts after the first, one row a step, padded in front with the empty part
        to the group's largest count."""
        steps = int(counts[rows].max())
        # part j (from 0) of a pattern of k more parts is flat[first + 1 + j - (steps - k)]
        index = (firsts[rows] + 1 - steps + counts[rows])[None, :] + np.arange(steps)[:, None]
        padding = index <= firsts[rows][None, :]
        index[padding] = 0
        table: Ints = flat[index]
        table[padding] = self._empty
        return table

    def _index(self, heads: Ints) -> None:
        """How the groups' parts are found in a path: first parts as prefixes (a dict lookup a
        distinct length), the others by length, sorted (binary search), or at the end ('$')."""
        used = np.zeros(len(self._texts), bool)
        used[heads] = True
        self._heads = {self._texts[n]: n for n in np.flatnonzero(used).tolist()}
        used[:] = False
        for _, steps in self._groups:
            used[steps] = True
        plain: dict[int, list[tuple[bytes, int]]] = {}
        for number in np.flatnonzero(used).tolist():
            text = self._texts[number]
            if text.endswith(b"$"):
                self._ends.setdefault(len(text) - 1, {})[text[:-1]] = number
            elif text:
                plain.setdefault(len(text), []).append((text, number))
        for length in sorted(plain):
            pairs = sorted(plain[length])
            found = np.array([text for text, _ in pairs], f"S{length}")
            self._plain.append((length, found, np.array([n for _, n in pairs], np.intp)))

    def cost(self, length: int) -> float:
        """An estimate of the CPU seconds a match of a path of ``length`` octets takes at worst
        (every pattern alive as long as it can be: a part advances at least one octet)."""
        seconds = self._few.cost(length)
        if not self._groups:
            return seconds
        width = length + 2
        windows = sum(max(0, length - size + 1) for size, _, _ in self._plain)
        held = min(len(self._texts), windows + len(self._ends) + 1)
        table = len(self._texts) * width <= _CELLS or held * width <= _CELLS
        seconds += _PLACES + len(self._plain) * _PLACES_OCTET * length
        seconds += min(len(self._texts), held) * width * _CELL if table else _CELLS * _CELL
        per_pattern = _STEP_PATTERN if table else _SEARCHED
        for rows, steps in self._groups:
            # the shortest pattern's padding, then at most a part an octet, then a check
            longest = min(steps.shape[0], int((steps[:, 0] == self._empty).sum()) + length
                          + 1 + _CHECK)
            seconds += rows.size * _GROUP_PATTERN + longest * (_STEP + per_pattern * rows.size)
        return seconds

    def first_match(self, path: str, limit: int) -> int | None:
        """The index of the first of patterns[:limit] that matches ``path``, or None."""
        data = path.encode("utf-8", "surrogateescape")
        best = self._few.first(data, limit)
        if self._groups and int(self._groups[0][0][0]) < best:
            best = self._walk_groups(data, best)
        return best if best < limit else None

    def _walk_groups(self, data: bytes, limit: int) -> int:
        """The first row below ``limit`` of the groups that matches, else ``limit``."""
        dead = len(data) + 1
        started = np.zeros(len(self._texts), bool)
        for length in self._head_lengths:
            number = self._heads.get(data[:length])
            if number is not None:
                started[number] = True
        places = _Places(self, data)
        for rows, steps in self._groups:
            count = int(np.searchsorted(rows, limit))
            if not count:
                break
            heads = self._head_of[rows[:count]]
            position = np.where(started[heads], self._head_size[heads], dead)
            for index, step in enumerate(steps[:, :count], start=1):
                position = places.after(step, position)
                if index % _CHECK == 0 and position.min() == dead:
                    break
            alive = np.flatnonzero(position != dead)
            if alive.size:
                limit = int(rows[alive[0]])
        return limit


def _numbered(joined: bytes) -> tuple[list[bytes], Ints]:
    """The distinct parts of ``joined`` (cut at each '*'), and its parts as their numbers.

    Parts of at most 8 octets (nearly all, in a hostile file) are numbered in numpy, each read
    as one integer; the others with a dict."""
    size = len(joined)
    buffer = np.frombuffer(joined + bytes(8), np.uint8)
    cuts = np.flatnonzero(buffer[:size] == ord("*"))
    starts = np.concatenate(([0], cuts + 1))
    lengths = np.concatenate((cuts, [size])) - starts
    numbers = np.empty(starts.size, np.intp)
    # an integer is the part only if no octet is 0 (never, once normalised: %00)
    short = lengths <= 8 if b"\0" not in joined else np.zeros(starts.size, bool)
    every = bool(short.all())
    which = np.arange(0) if every else np.flatnonzero(short)
    words = np.ndarray((size + 1,), "<u8", buffer, 0, (1,))  # the 8 octets from each place
    keys = words[starts] & _LOW_OCTETS[lengths] if every else (
        words[starts[which]] & _LOW_OCTETS[lengths[which]])
    order = np.argsort(keys)
    ordered = keys[order]
    new = np.ones(order.size, bool)
    new[1:] = ordered[1:] != ordered[:-1]
    first = order[new] if every else which[order[new]]  # each distinct one's first
    numbers[order if every else which[order]] = np.cumsum(new) - 1
    texts = [joined[at: at + length] for at, length in zip(
        starts[first].tolist(), lengths[first].tolist(), strict=True)]
    if not every:
        known = {text: number for number, text in enumerate(texts)}
        which = np.flatnonzero(~short)
        for index, at, length in zip(which.tolist(), starts[which].tolist(),
                                     lengths[which].tolist(), strict=True):
            text = joined[at: at + length]
            number = known.setdefault(text, len(texts))
            if number == len(texts):
                texts.append(text)
            numbers[index] = number
    return texts, numbers


def _grouped(counts: Ints) -> list[Ints]:
    """Rows (ascending) by number of parts, rounded up by at most a quarter (few groups)."""
    grain = 1 << np.maximum(0, np.log2(np.maximum(counts, 1)).astype(np.intp) - 2)
    shared = -(-counts // grain) * grain
    order = np.argsort(shared, kind="stable")
    return np.split(order, np.flatnonzero(np.diff(shared[order])) + 1)


class _Places:
    """Where each part next ends in one path, from each place: a table, or a binary search."""

    def __init__(self, patterns: WildcardSet, data: bytes) -> None:
        size = len(data)
        width = size + 2  # places 0 to size, then one past the end: dead
        numbers, starts, lengths = [], [], []
        for length, texts, which in patterns._plain:
            if length > size:
                break
            windows = np.ndarray((size - length + 1,), texts.dtype, data, 0, (1,))
            at = np.searchsorted(texts, windows)
            np.minimum(at, texts.size - 1, out=at)
            found = np.flatnonzero(texts[at] == windows)
            numbers.append(which[at[found]])
            starts.append(found)
            lengths.append(np.full(found.size, length, np.intp))
        for length, table in patterns._ends.items():
            if length <= size and (last := table.get(data[size - length:])) is not None:
                numbers.append(np.array([last], np.intp))
                starts.append(np.array([size - length], np.intp))
                lengths.append(np.array([length], np.intp))
        everywhere = np.arange(size + 1, dtype=np.intp)  # the empty part
        numbers.append(np.full(size + 1, patterns._empty, np.intp))
        starts.append(everywhere)
        lengths.append(np.zeros(size + 1, np.intp))
        number, start = np.concatenate(numbers), np.concatenate(starts)
        end = start + np.concatenate(lengths)
        count = len(patterns._texts)
        self._rows: Ints | None = None
        if count * width > _CELLS:  # rows for the parts the path holds only, one for the rest
            held = np.unique(number)
            self._rows = np.full(count, held.size, np.intp)
            self._rows[held] = np.arange(held.size)
            number, count = self._rows[number], held.size + 1
        # a sorted key a part and place it occurs at, and one past the end of each part's row
        key = np.concatenate((number * width + start, np.arange(1, count + 1) * width - 1))
        order = np.argsort(key)
        self._keys = key[order]
        self._next = np.concatenate((end, np.full(count, width - 1, np.intp)))[order]
        self._width = width
        self._table: Ints | None = None
        if count * width <= _CELLS:  # each cell: the next key's end
            self._table = np.repeat(self._next, np.diff(self._keys, prepend=-1))

    def after(self, parts: Ints, places: Ints) -> Ints:
        """The end of each part's leftmost occurrence at or after its place (dead stays dead)."""
        keys = (parts if self._rows is None else self._rows[parts]) * self._width
        keys += places
        if self._table is not None:
            return self._table[keys]
        return self._next[np.searchsorted(self._keys, keys)]
