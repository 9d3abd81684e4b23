"""The deep-nesting guard: elements nested deeper than MAX_NESTING are dropped before parsing.

lexbor's tree builder is quadratic in the nesting depth (32,000 nested `<div>` take seconds):
a page that may nest that deep is flattened first. `deeper_than` tells, in NumPy, whether a page
may; `flatten`, a regular expression with a callback per tag, does it. Imported by `parse` only
for pages of more than parse.COUNT_IN_NUMPY bytes (`tags` counts their "<"), so the crawl
process does not load NumPy for a usual page.
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

#: elements nested deeper than this are dropped before parsing (deep nesting is quadratic)
MAX_NESTING = 256
#: tags never dropped: void elements, optional end tags, and what the crawler reads
_FLAT = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
    "source", "track", "wbr", "keygen", "p", "li", "dt", "dd", "tr", "td", "th", "option",
    "optgroup", "rb", "rt", "rp", "thead", "tbody", "tfoot", "colgroup", "caption", "html",
    "head", "body", "a", "title",
})
#: opening or closing tags of the elements that nest (the others are skipped by the regex engine)
_TAG = re.compile(
    r"<(/?)(?!(?:" + "|".join(sorted(_FLAT)) + r")[\s/>])([a-zA-Z][a-zA-Z0-9:-]*)[^<>]*?(/?)>",
    re.I,
)


def _byte_table(members: bytes | range | list[int]) -> npt.NDArray[np.bool_]:
    """A lookup table: byte -> whether it is one of `members`."""
    table = np.zeros(256, dtype=np.bool_)
    table[list(members)] = True
    return table


_LOWER = np.arange(256, dtype=np.uint8)
_LOWER[65:91] += 32  # ASCII lower case
_LETTER = _byte_table(range(97, 123))
_NAME_CHAR = _byte_table(b"abcdefghijklmnopqrstuvwxyz0123456789:-")
_ENDS_FLAT = _byte_table(b"\t\n\x0b\x0c\r />")
_OPENS = _byte_table([*range(97, 123), *range(128, 256)])  # a letter or any non-ASCII byte
_FLAT_KEYS = np.array(sorted(int.from_bytes(n.encode().ljust(8, b"\0"), "little") for n in _FLAT),
                      dtype=np.uint64)
_KEEP = np.array([(1 << 8 * n) - 1 for n in range(9)], dtype=np.uint64)  # a name's n bytes


def tags(html: bytes) -> int:
    """How many "<" the page has: bytes.count's result, 8 times faster on a large page."""
    return int(np.count_nonzero(np.frombuffer(html, dtype=np.uint8) == 60))


def flattened(html: bytes) -> bytes:
    """The page (UTF-8) as lexbor should parse it: flattened if it may nest too deep."""
    return flatten(html.decode(errors="replace")).encode() if deeper_than(html) else html


def flatten(html: str, max_depth: int = MAX_NESTING) -> str:
    """Drop the opening and closing tags of elements nested deeper than max_depth.

    A rough tag scan (linear time), not a parser: the depth counts elements that nest; what
    the crawler reads (links, base, canonical, meta robots, title) is never dropped. A regular
    expression's sub with a callback: about 7,000 instructions a tag (as many as a loop over
    `split("<")` written by hand), so it runs only on pages `deeper_than` finds may need it.
    """
    depth = 0

    def visit(m: re.Match[str]) -> str:
        nonlocal depth
        if m.group(3):
            return m.group(0)
        if m.group(1):  # a closing tag
            depth = max(0, depth - 1)
            return m.group(0) if depth < max_depth else ""
        depth += 1
        return m.group(0) if depth <= max_depth else ""

    return _TAG.sub(visit, html)


def deeper_than(html: bytes, max_depth: int = MAX_NESTING) -> bool:
    """Whether `flatten` could drop a tag: an upper bound of its nesting depth, vectorized.

    The same rough tag model as flatten's regular expression, scanned with NumPy over the page's
    UTF-8 bytes, with every doubt on the deeper side: any "<" before a letter or a non-ASCII byte
    opens, unless the tag is one of the elements that do not nest followed by a space, "/" or
    ">", or ends in "/>" before the next "<"; "</" and a letter closes only where the tag ends
    before the next "<" and is not one of those. The depth after each tag, floored at zero as
    flatten's is, is the prefix sum less its running minimum. About 40 µs on a 50 KB page,
    where flatten costs over 1 ms: real pages with thousands of tags are never flattened.
    """
    raw = html + b"\0" * 9
    data = np.frombuffer(raw, dtype=np.uint8)
    angles = ((data == 60) | (data == 62)).nonzero()[0]  # every "<" and ">", in order
    is_lt = data[angles] == 60
    lt = angles[is_lt]
    if len(lt) <= max_depth:
        return False
    # a tag ends before the next "<" when the next angle bracket is a ">"
    after = np.append(angles, len(data) - 1)[is_lt.nonzero()[0] + 1]
    ends_first = data[after] == 62
    self_closing = ends_first & (data[after - 1] == 47)
    closing = data[lt + 1] == 47
    windows = np.ndarray((len(raw) - 8, 9), np.uint8, raw, strides=(1, 1))  # 9 bytes from each
    window = _LOWER[windows[lt + 1 + closing]]  # the name's first 9 bytes
    name_char = _NAME_CHAR[window]
    length = name_char.argmin(axis=1)
    length[name_char[:, 8] & (length == 0) & name_char[:, 0]] = 9  # all 9 are a name's bytes
    cut = np.minimum(length, 8)
    key = window[:, :8].copy().view(np.uint64).ravel() & _KEEP[cut]
    flat_name = (_FLAT_KEYS.take(np.searchsorted(_FLAT_KEYS, key), mode="clip") == key) & (
        length <= 8)
    strictly_flat = flat_name & _ENDS_FLAT[np.take_along_axis(window, cut[:, None], 1).ravel()]
    first = window[:, 0]
    opens = ~closing & _OPENS[first] & ~strictly_flat & ~self_closing
    closes = closing & _LETTER[first] & ~flat_name & ends_first & ~self_closing
    depth = np.cumsum(opens.astype(np.int32) - closes)
    depth -= np.minimum(np.minimum.accumulate(depth), 0)
    return bool(depth.max() > max_depth)
