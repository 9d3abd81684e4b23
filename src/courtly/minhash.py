"""The MinHash signature of a page's text, vectorized with NumPy (the scheme: `courtly.dedup`).

Imported only where pages are analysed (the page worker): the crawl process does not load NumPy.
"""

from __future__ import annotations

import string

import numpy as np
import numpy.typing as npt

from courtly.dedup import BINS, SHINGLE, TEXT_LIMIT

_EMPTY = 1 << 16  # a bin no shingle fell in (the values are 16-bit)
#: ASCII punctuation as spaces, for UTF-8 bytes (no multi-byte sequence contains an ASCII byte)
_PUNCTUATION = b"!\"#$%&'()*+,-./:;<=>?@[\\]^`{|}~"  # all but '_', a word character
_SEPARATORS = bytes.maketrans(_PUNCTUATION, b" " * len(_PUNCTUATION))
_UPPER = string.ascii_uppercase.encode()
#: the same, and ASCII lower-cased: an ASCII text's bytes take both in one pass
_LOWER_SEPARATORS = bytes.maketrans(
    _PUNCTUATION + _UPPER, b" " * len(_PUNCTUATION) + _UPPER.lower()
)
_P = 0x100000001B3  # odd, so invertible modulo 2**64
U64 = npt.NDArray[np.uint64]


def _u64(value: int) -> U64:
    """A 0-d uint64 array: ufuncs take it faster than a NumPy scalar (same results)."""
    return np.array(value, dtype=np.uint64)


def _powers(base: int) -> U64:
    """base**i modulo 2**64 for i in 0..TEXT_LIMIT + 2 (the text and a space either side)."""
    out = np.cumprod(np.full(TEXT_LIMIT + 2, np.uint64(base), dtype=np.uint64))
    return np.concatenate(([np.uint64(1)], out))


_POWERS = _powers(_P)
_INVERSES = _powers(pow(_P, -1, 1 << 64))[1:]  # _INVERSES[i] = _P**-(i + 1)
_K1, _K2 = _u64(0x9E3779B97F4A7C15), _u64(0xC2B2AE3D27D4EB4F)
_S27, _S30, _S31, _S48 = _u64(27), _u64(30), _u64(31), _u64(48)
_BIN_MASK = np.array(BINS - 1, dtype=np.int64)  # BINS is a power of two; int64 to index with
_NO_VALUES = np.full(BINS, _EMPTY, dtype=np.uint64)
_PACKED = np.dtype("<u2")  # dedup.PACK's values: 16-bit, little-endian


def _mix(h: U64) -> U64:
    """splitmix64's finalizer, in place: every input bit affects every output bit."""
    shifted = h >> _S30
    h ^= shifted
    h *= _K1
    np.right_shift(h, _S27, out=shifted)
    h ^= shifted
    h *= _K2
    np.right_shift(h, _S31, out=shifted)
    h ^= shifted
    return h


def word_hashes(text: str) -> U64:
    """A 64-bit hash per word (lower-cased; whitespace and ASCII punctuation separate words).

    Written by hand, vectorized: polynomial prefix sums give every word's hash at once, where a
    per-word call to a hash function would cost more than the rest of the page's processing.
    """
    if text.isascii():  # one pass lower-cases and separates (str.isascii is a flag, O(1))
        raw = text.encode()[:TEXT_LIMIT].translate(_LOWER_SEPARATORS)
    else:
        raw = text.lower().encode("utf-8", "replace")[:TEXT_LIMIT].translate(_SEPARATORS)
    data = np.frombuffer(b" " + raw + b" ", dtype=np.uint8)  # every word has a start and an end
    inside = data > 32
    edges = (inside[1:] != inside[:-1]).nonzero()[0]
    starts = edges[::2]  # a word is data[start + 1:end + 1]
    sums = np.multiply(data, _POWERS[: len(data)])
    np.add.accumulate(sums, out=sums)  # sums[i]: the hash of data[:i + 1], unscaled (uint64 wraps)
    h = sums.take(edges[1::2])  # take: cheaper than fancy indexing, same result
    h -= sums.take(starts)
    h *= _INVERSES.take(starts)
    return _mix(h)


def shingle_hashes(words: U64) -> U64:
    """One 64-bit hash per run of SHINGLE consecutive words."""
    if len(words) < SHINGLE:
        return np.array([np.bitwise_xor.reduce(words)], dtype=np.uint64)
    n = len(words) - SHINGLE + 1
    h = words[:n] * _K1
    h ^= words[1:n + 1] * _K2
    h ^= words[2:n + 2]
    return _mix(h)


def signature(text: str, min_words: int) -> bytes | None:
    """The MinHash signature of a text (BINS 16-bit values, packed), or None if it has fewer
    than `min_words` words (dedup.min_words)."""
    words = word_hashes(text)
    if len(words) < min_words:
        return None
    h = shingle_hashes(words)
    sig = _NO_VALUES.copy()
    np.minimum.at(sig, h.view(np.int64) & _BIN_MASK, h >> _S48)  # the bin from the low bits
    empty = np.flatnonzero(sig == _EMPTY)
    if len(empty):
        # rotation densification: an empty bin takes the next filled bin's value, moved by the
        # distance, so two pages with the same filled bins get the same values
        values = sig.tolist()
        for i in empty.tolist():
            step = 1
            while values[(i + step) % BINS] == _EMPTY:
                step += 1
            sig[i] = (values[(i + step) % BINS] + step * 0x9E37) & 0xFFFF
    return sig.astype(_PACKED).tobytes()  # PACK's layout, without a Python int a value
