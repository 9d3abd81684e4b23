"""Content fingerprints: exact (a hash of the body) and near-duplicate (MinHash with LSH bands).

Near-duplicates: the page text is cut into word shingles (runs of SHINGLE words); a MinHash
signature of BINS values estimates the Jaccard similarity of two pages' shingle sets (the fraction
of equal values). The signature is computed by one-permutation hashing — one hash per shingle,
the shingle's bin from its low bits, the bin keeps the smallest value — with rotation
densification for empty bins, so it costs one hash per shingle, not BINS.

The index: the first BANDS bands of ROWS values of the signature each hash to one key (the
band's number is part of the key). Two pages with Jaccard similarity J share at least one key
with probability 1 - (1 - J**ROWS)**BANDS (98.5 % at J = 0.8, the default threshold; 99.7 % at
0.85, 99.98 % at 0.9); a lookup reads the pages that share a key (one indexed query) and
compares their whole signatures. The keys are random B-tree inserts and probes, the costliest
part of a crawl action's writes, growing with the crawl: 8 of the 32 bands are indexed, which
halves that cost (bench/dedup_bench.py --index: 97 → 45 µs a page at 50k crawled pages, 161
→ 81 at 200k) for one miss in 200 copies with 2 % of their words changed. Databases written
before keep their other keys per page, unused (the first 8 bands' keys are the same).

Why MinHash rather than simhash: bench/dedup_bench.py. On real text with known edits, a 64-bit
simhash within Hamming distance 3 found 26–79 % of the copies with 0.5 % of their words changed
and 11–28 % of the copies with a new navigation bar; this finds 100 % of both, with no false
positive, in less time per page (0.1 ms for a 5 KB page, vectorized with NumPy), for 256 bytes of
signature and 8 index rows per page (simhash: 8 bytes and 4 rows).
"""

from __future__ import annotations

import functools
import string
import struct

import numpy as np
import numpy.typing as npt
import xxhash

exact_fingerprint = xxhash.xxh3_128_hexdigest

BINS = 128
ROWS = 4
BANDS = 8  # indexed bands: 32 of the BINS values
SHINGLE = 3
#: pages with fewer words than this get no signature: tiny pages look alike by chance
MIN_WORDS = 20

_EMPTY = 1 << 16
_PACK = struct.Struct(f"<{BINS}H")


#: ASCII punctuation as spaces, for UTF-8 bytes (no multi-byte sequence contains an ASCII byte)
_PUNCTUATION = b"!\"#$%&'()*+,-./:;<=>?@[\\]^`{|}~"  # all but '_', a word character
_SEPARATORS = bytes.maketrans(_PUNCTUATION, b" " * len(_PUNCTUATION))
_UPPER = string.ascii_uppercase.encode()
#: the same, and ASCII lower-cased: an ASCII text's bytes take both in one pass
_LOWER_SEPARATORS = bytes.maketrans(
    _PUNCTUATION + _UPPER, b" " * len(_PUNCTUATION) + _UPPER.lower()
)
#: only the first TEXT_LIMIT bytes of a page's text are fingerprinted
TEXT_LIMIT = 64 * 1024
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


def signature(text: str, min_words: int = MIN_WORDS) -> bytes | None:
    """The MinHash signature of a text (BINS 16-bit values, packed), or None if too short."""
    words = word_hashes(text)
    if len(words) < min_words:
        return None
    h = shingle_hashes(words)
    sig = _NO_VALUES.copy()
    np.minimum.at(sig, h.view(np.int64) & _BIN_MASK, h >> _S48)  # the bin from the low bits
    values = sig.tolist()
    if _EMPTY not in values:
        return _PACK.pack(*values)
    # rotation densification: an empty bin takes the next filled bin's value, moved by the
    # distance, so two pages with the same filled bins get the same values
    out = list(values)
    for i in np.flatnonzero(sig == _EMPTY).tolist():
        step = 1
        while values[(i + step) % BINS] == _EMPTY:
            step += 1
        out[i] = (values[(i + step) % BINS] + step * 0x9E37) & 0xFFFF
    return _PACK.pack(*out)


def similarity(a: bytes, b: bytes) -> float:
    """Estimated Jaccard similarity of two signatures' shingle sets."""
    same: int = sum(x == y for x, y in zip(_PACK.unpack(a), _PACK.unpack(b), strict=True))
    return same / BINS


@functools.lru_cache(maxsize=64)  # a page's keys are looked up, then stored
def band_keys(sig: bytes) -> tuple[int, ...]:
    """One signed 64-bit key per band (the band number is hashed in)."""
    width = ROWS * 2
    return tuple(
        to_signed(xxhash.xxh64_intdigest(sig[i * width:(i + 1) * width], seed=i))
        for i in range(BANDS)
    )


def to_signed(value: int) -> int:
    """An unsigned 64-bit value as the signed BIGINT a database stores."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value
