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
compares their whole signatures.

The cost of a page is bounded whatever the crawl's size: pages on one template share keys by
chance, and a bucket (the pages of one key) would grow with the crawl. A lookup reads at most
MEMBERS pages a key, the first indexed (the bucket's representatives), so at most
BANDS × MEMBERS; a page's key is not added to a bucket that already holds MEMBERS pages, and
only pages judged OK are indexed. A page that would have matched a page past the
representatives of one bucket still shares its other keys with it, whose buckets are not full
unless templated pages crowd them too. Each key row holds its page's sketch (the low 2 bits of
each value, 32 bytes): a page whose sketch differs in more values than min_similarity allows
cannot be similar enough, and only the others' signatures are read (a templated page: none; a
random read into the signatures, the growing cost of a lookup when they were read for every
page of the buckets). New keys go to a small table merged in key order into the index when
they are a RECENT_SHARE-th of it (random inserts into the large B-tree wrote one of its pages
per key at each commit). A crawl that writes the database alone keeps a KeyFilter of each
table's keys and probes only the keys they may hold (most pages: none). 8 of the 32 bands are
indexed (16 cost twice the writes for one miss in 200 copies with 2 % of their words changed).
bench/dedup_bench.py --index 20000 200000 measures the cost a page at both sizes
(bench/RESULTS.md).

Why MinHash rather than simhash: bench/dedup_bench.py. On real text with known edits, a 64-bit
simhash within Hamming distance 3 found 26–79 % of the copies with 0.5 % of their words changed
and 11–28 % of the copies with a new navigation bar; this finds 100 % of both, with no false
positive, in less time per page (0.1 ms for a 5 KB page, vectorized with NumPy), for 256 bytes of
signature and 8 index rows per page (simhash: 8 bytes and 4 rows).

The signature is computed in `courtly.minhash` (NumPy, loaded only where pages are analysed);
this module holds what the crawl database needs: the fingerprints' shape, the band keys and the
similarity of two signatures.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable

import xxhash

exact_fingerprint = xxhash.xxh3_128_hexdigest

BINS = 128
ROWS = 4
BANDS = 8  # indexed bands: 32 of the BINS values
#: pages compared (and indexed) per band key
MEMBERS = 8
#: band keys are written to a small table first, merged in key order into the index when they
#: are at least RECENT and a 1 / RECENT_SHARE of it
RECENT = 16384
RECENT_SHARE = 8
#: a KeyFilter's bits (1 MiB)
FILTER_BITS = 1 << 23
SHINGLE = 3

#: only the first TEXT_LIMIT bytes of a page's text are fingerprinted
TEXT_LIMIT = 64 * 1024
PACK = struct.Struct(f"<{BINS}H")  # a signature: BINS little-endian 16-bit values


_LANE_LOW_BITS = int.from_bytes(b"\x01\x00" * BINS, "little")


def similarity(a: bytes, b: bytes) -> float:
    """Estimated Jaccard similarity of two signatures' shingle sets: the fraction of equal values.

    As integers: a value differs where its 16 bits of the XOR are not all zero; OR-folding a
    lane's bits down to its lowest bit (shifts of 1, 2, 4, 8 stay inside the lane) leaves one bit
    per differing value, counted at once. 20 times faster than comparing the unpacked values.
    """
    x = int.from_bytes(a, "little") ^ int.from_bytes(b, "little")
    x |= x >> 1
    x |= x >> 2
    x |= x >> 4
    x |= x >> 8
    return 1.0 - (x & _LANE_LOW_BITS).bit_count() / BINS


_LOW_2 = bytes(b & 3 for b in range(256))
_NIBBLES = int.from_bytes(b"\x0f\x00" * (BINS // 2), "little")
_BYTES = int.from_bytes(b"\xff\x00\x00\x00" * (BINS // 4), "little")
_PAIR_LOW_BITS = int.from_bytes(b"\x55" * (BINS // 4), "little")


@functools.lru_cache(maxsize=64)  # a page's sketch is used by its lookup, then stored
def sketch(sig: bytes) -> bytes:
    """The low 2 bits of each of the signature's values, packed (BINS // 4 bytes).

    Where two signatures' values are equal, so are their sketches': a sketch differs from
    another in at most as many values as the signature does, so a page whose sketch differs in
    too many cannot be similar enough (sketch_filter), and its signature is not read.
    """
    x = int.from_bytes(sig[0::2].translate(_LOW_2), "little")  # each value's low byte, & 3
    x = (x | x >> 6) & _NIBBLES  # two values a nibble, in each 16 bits
    x = (x | x >> 12) & _BYTES  # four values a byte, in each 32 bits
    return x.to_bytes(BINS, "little")[0::4]


def sketch_filter(sig: bytes, min_similarity: float) -> Callable[[object], bool]:
    """Whether a stored sketch may belong to a page at min_similarity or more to `sig` (True
    for a value that is not a sketch: the signature decides)."""
    mine = int.from_bytes(sketch(sig), "little")
    size = BINS // 4

    def near(other: object) -> bool:
        if not isinstance(other, bytes | bytearray | memoryview) or len(other) != size:
            return True
        x = mine ^ int.from_bytes(other, "little")
        return 1.0 - ((x | x >> 1) & _PAIR_LOW_BITS).bit_count() / BINS >= min_similarity

    return near


_BANDS = [slice(i * ROWS * 2, (i + 1) * ROWS * 2) for i in range(BANDS)]
_KEYS = struct.Struct(f">{BANDS}q")  # the digests, big-endian, as signed 64-bit integers


@functools.lru_cache(maxsize=64)  # a page's keys are looked up, then stored
def band_keys(sig: bytes) -> tuple[int, ...]:
    """One signed 64-bit key per band (the band number is hashed in): each band's xxh64 as a
    signed integer, unpacked at once (half the time of one integer at a time)."""
    digest = xxhash.xxh64_digest
    return _KEYS.unpack(b"".join([digest(sig[band], seed=i) for i, band in enumerate(_BANDS)]))


class KeyFilter:
    """Which band keys a table may hold: a bit each, the key's low bits (keys are hashes). A
    clear bit: the key is not there; a set one: it may be (at 400,000 keys, 5 % of the others)."""

    __slots__ = ("bits",)
    _MASK = FILTER_BITS - 1

    def __init__(self, bits: bytes | None = None) -> None:
        self.bits = bytearray(bits if bits is not None else FILTER_BITS // 8)

    @classmethod
    def stored(cls, value: object) -> KeyFilter | None:
        """A filter as a database stored it (None: not a filter's bits)."""
        if not isinstance(value, bytes | bytearray | memoryview) or len(value) != FILTER_BITS // 8:
            return None
        return cls(bytes(value))

    def add(self, keys: Iterable[int]) -> None:
        """These keys are in the table now."""
        bits, mask = self.bits, self._MASK
        for key in keys:
            bit = key & mask
            bits[bit >> 3] |= 1 << (bit & 7)

    def holding(self, keys: Iterable[int]) -> list[int]:
        """The keys the table may hold."""
        bits, mask = self.bits, self._MASK
        return [k for k in keys if bits[(bit := k & mask) >> 3] >> (bit & 7) & 1]
