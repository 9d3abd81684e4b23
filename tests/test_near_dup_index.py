"""The near-duplicate index: a lookup's cost bounded whatever the crawl's size, on both backends."""

from __future__ import annotations

import random
from pathlib import Path

from courtly import dedup
from courtly.model import CrawlAction, ExitCode, Link
from courtly.store import open_store
from tests.conftest import rows

BACKENDS = ("sqlite", "postgres")


def templated(rng: random.Random, shared: bytes) -> bytes:
    """A signature whose first band is `shared` (pages on one template), the rest its own."""
    return shared + rng.randbytes(dedup.PACK.size - len(shared))


def test_a_crowded_band_key_holds_and_compares_at_most_members(db: Path) -> None:
    """200 pages share a band key: the bucket keeps MEMBERS of them, a lookup reads no more,
    and a near-copy of a page past them is still found through its other keys."""
    rng = random.Random(5)
    shared = rng.randbytes(2 * dedup.ROWS)
    store = open_store(str(db))
    n = 200
    store.add_links([Link(f"http://a/{i}", "http://a", 0) for i in range(n)])
    signatures = {}
    for cand in store.take_todo("http://a", 1, n, 0.0):
        sig = templated(rng, shared)
        signatures[cand.url] = sig
        assert store.find_similar(sig, cand.url, 0.8) is None  # the crawler asks, then records
        action = CrawlAction(cand, "http://a", ExitCode.OK, 0.0)
        action.near_signature = sig
        store.record(action, 1)
    store.flush()
    key = dedup.band_keys(templated(rng, shared))[0]
    held = rows(db, "SELECT COUNT(*) AS n FROM near_dup_keys WHERE key = ?", key)[0]["n"]
    assert held == dedup.MEMBERS
    others = rows(db, "SELECT COUNT(*) AS n FROM near_dup_keys WHERE key <> ?", key)[0]["n"]
    assert others == n * (dedup.BANDS - 1)
    copy = bytearray(signatures["http://a/150"])
    copy[-2:] = b"\xff\xff"  # one value of 128 changed, in a band that is not indexed
    found = store.find_similar(bytes(copy), "http://a/new", 0.8)
    assert found is not None and found[0] == "http://a/150" and found[1] >= 0.99
    store.close()


def test_pages_not_ok_are_not_indexed(db: Path) -> None:
    """A near-duplicate keeps its signature (a recrawl replaces it) but takes no bucket place."""
    rng = random.Random(6)
    store = open_store(str(db))
    store.add_links([Link("http://a/dup", "http://a", 0)])
    cand = store.take_todo("http://a", 1, 1, 0.0)[0]
    action = CrawlAction(cand, "http://a", ExitCode.DUPLICATE_CONTENT, 0.0)
    action.near_signature = rng.randbytes(dedup.PACK.size)
    store.record(action, 1)
    store.flush()
    assert rows(db, "SELECT COUNT(*) AS n FROM near_dup")[0]["n"] == 1
    assert rows(db, "SELECT COUNT(*) AS n FROM near_dup_keys")[0]["n"] == 0
    store.close()


def test_similarity_is_the_fraction_of_equal_values() -> None:
    """The integer fold counts exactly the 16-bit values that differ, wherever their bits are."""
    rng = random.Random(7)
    for _ in range(500):
        a = rng.randbytes(dedup.PACK.size)
        b = bytearray(a)
        for i in rng.sample(range(dedup.BINS), rng.randrange(dedup.BINS + 1)):
            bit = 1 << rng.randrange(16)  # one bit of the value, low or high byte
            b[2 * i:2 * i + 2] = (int.from_bytes(b[2 * i:2 * i + 2], "little") ^ bit).to_bytes(
                2, "little")
        same = sum(x == y for x, y in zip(dedup.PACK.unpack(a), dedup.PACK.unpack(bytes(b)),
                                          strict=True))
        assert dedup.similarity(a, bytes(b)) == same / dedup.BINS
