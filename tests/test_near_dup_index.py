"""The near-duplicate index: a lookup's cost bounded whatever the crawl's size, on both backends."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import xxhash

from courtly import dedup
from courtly.model import Candidate, CrawlAction, ExitCode, Link
from courtly.store import open_store
from courtly.store.base import Write
from courtly.store.postgres import PostgresStore
from tests.conftest import BAND_KEYS, UNDO_MIGRATION_17, execute, rows
from tests.pgserver import PgUrl

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
    held = rows(db, f"SELECT COUNT(*) AS n FROM {BAND_KEYS} WHERE key = ?", key)[0]["n"]
    assert held == dedup.MEMBERS
    others = rows(db, f"SELECT COUNT(*) AS n FROM {BAND_KEYS} WHERE key <> ?", key)[0]["n"]
    assert others == n * (dedup.BANDS - 1)
    copy = bytearray(signatures["http://a/150"])
    copy[-2:] = b"\xff\xff"  # one value of 128 changed, in a band that is not indexed
    found = store.find_similar(bytes(copy), "http://a/new", 0.8)
    assert found is not None and found[0] == "http://a/150" and found[1] >= 0.99
    store.close()


def test_recent_keys_are_found_after_a_restart_and_a_bucket_holds_without_a_lookup(
    db: Path,
) -> None:
    """A store reopened on recent keys finds them (its filter of the recent table starts at the
    next merge), and a page recorded without a lookup still takes no place in a full bucket."""
    rng = random.Random(11)
    shared = rng.randbytes(2 * dedup.ROWS)
    store = open_store(str(db))
    n = dedup.MEMBERS + 4
    store.add_links([Link(f"http://a/{i}", "http://a", 0) for i in range(n)])
    signatures = {}
    for i, cand in enumerate(store.take_todo("http://a", 1, n, 0.0)):
        sig = signatures[cand.url] = templated(rng, shared)
        if i % 2:  # every other page recorded without asking first
            assert store.find_similar(sig, cand.url, 0.8) is None
        action = CrawlAction(cand, "http://a", ExitCode.OK, 0.0)
        action.near_signature = sig
        store.record(action, 1)
    store.flush()
    key = dedup.band_keys(templated(rng, shared))[0]
    assert rows(db, f"SELECT COUNT(*) AS n FROM {BAND_KEYS} WHERE key = ?", key)[0]["n"] == (
        dedup.MEMBERS)
    store.close()
    again = open_store(str(db))
    for url in ("http://a/0", f"http://a/{n - 1}"):
        copy = bytearray(signatures[url])
        copy[-2:] = b"\xff\xff"
        found = again.find_similar(bytes(copy), "http://a/new", 0.8)
        assert found is not None and found[0] == url
    again.close()


def test_the_index_filter_is_stored_with_each_merge_and_read_again(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crawl that writes the database alone probes the keys its filters may hold: the index's
    filter is stored with each merge; a store reopened finds merged pages through the stored
    filter, and through one read from the index when it is missing or damaged."""
    monkeypatch.setattr(dedup, "RECENT", 40)
    rng = random.Random(12)
    store = open_store(str(db))
    n = 12  # 96 keys: merged at 40 and 80
    store.add_links([Link(f"http://a/{i}", "http://a", 0) for i in range(n)])
    signatures = {}
    for cand in store.take_todo("http://a", 1, n, 0.0):
        sig = signatures[cand.url] = rng.randbytes(dedup.PACK.size)
        assert store.find_similar(sig, cand.url, 0.8) is None
        action = CrawlAction(cand, "http://a", ExitCode.OK, 0.0)
        action.near_signature = sig
        store.record(action, 1)
    store.flush()
    store.close()
    stored = rows(db, "SELECT bits FROM near_dup_filter")
    if not str(db).startswith("postgresql"):  # a fleet's workers probe every key: no filter
        bits = dedup.KeyFilter.stored(stored[0]["bits"])
        assert bits is not None and len(bits.holding(dedup.band_keys(signatures["http://a/0"]))
                                        ) == dedup.BANDS

    def found_again() -> None:
        again = open_store(str(db))
        for url in ("http://a/0", "http://a/9", f"http://a/{n - 1}"):  # merged, and recent
            copy = bytearray(signatures[url])
            copy[-2:] = b"\xff\xff"
            found = again.find_similar(bytes(copy), "http://a/new", 0.8)
            assert found is not None and found[0] == url
        again.close()

    found_again()
    if not str(db).startswith("postgresql"):
        for damage in ("UPDATE near_dup_filter SET bits = x'00'", "DELETE FROM near_dup_filter"):
            execute(db, damage)
            found_again()


@pytest.mark.postgres
def test_a_fleets_page_sharing_no_key_is_recorded_without_a_query(
    pg_url: PgUrl, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a page whose look-up found none of its band keys is recorded without
    counting its buckets again (that query in the write batch made a worker fetch a page twice
    at a connection cut)."""
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    store.add_links([Link("http://a/1", "http://a", 0)])
    cand = store.take_todo("http://a", 1, 1, 0.0)[0]
    signature = random.Random(14).randbytes(dedup.PACK.size)
    assert store.page_lookups(None, signature, cand.url, 0.8, None, 0.0) == (
        None, None, None, None)
    action = CrawlAction(cand, "http://a", ExitCode.OK, 0.0)
    action.near_signature = signature
    queries: list[str] = []
    execute_one = store._x

    def traced(sql: str, params: Any = ()) -> Any:
        queries.append(sql)
        return execute_one(sql, params)

    monkeypatch.setattr(store, "_x", traced)
    assert store.write_batch([Write(action=action, run=1)]) == []
    assert not [q for q in queries if "candidate, sketch FROM near_dup" in q], queries
    assert rows(pg_url, f"SELECT COUNT(*) AS n FROM {BAND_KEYS}")[0]["n"] == dedup.BANDS
    store.close()


def test_keys_a_fleet_staged_before_are_merged_and_found(pg_url: PgUrl) -> None:
    """PostgreSQL once staged band keys in near_dup_recent; migration 15 merges them into
    near_dup_keys, all that a fleet's look-ups probe now: a page sharing one is still found."""
    store = open_store(pg_url)
    store.add_links([Link("http://a/old", "http://a", 0)])
    cand = store.take_todo("http://a", 1, 1, 0.0)[0]
    action = CrawlAction(cand, "http://a", ExitCode.OK, 0.0)
    signature = action.near_signature = random.Random(15).randbytes(dedup.PACK.size)
    store.record(action, 1)
    store.flush()
    store.close()
    execute(pg_url,  # a database of schema 14 as that version left it: its keys staged
            "INSERT INTO near_dup_recent (key, candidate, sketch, part) "
            "SELECT key, candidate, sketch, part FROM near_dup_keys",
            "DELETE FROM near_dup_keys", *UNDO_MIGRATION_17,
            "UPDATE schema_version SET version = 14")
    store = open_store(pg_url)  # migrated
    assert rows(pg_url, "SELECT COUNT(*) AS n FROM near_dup_recent") == [{"n": 0}]
    assert rows(pg_url, "SELECT COUNT(*) AS n FROM near_dup_keys") == [{"n": dedup.BANDS}]
    copy = bytearray(signature)
    copy[-2:] = b"\xff\xff"
    _, similar, _, _ = store.page_lookups(None, bytes(copy), "http://a/new", 0.8, None, 0.0)
    assert similar is not None and similar[0] == "http://a/old"
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
    assert rows(db, f"SELECT COUNT(*) AS n FROM {BAND_KEYS}")[0]["n"] == 0
    store.close()


def test_recent_keys_are_merged_into_the_index_and_found_in_both(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New keys go to near_dup_recent, moved into near_dup_keys once they are RECENT and a
    RECENT_SHARE-th of it (SQLite; on PostgreSQL straight to near_dup_keys); lookups find pages
    in both, and a recrawl replaces keys in both."""
    monkeypatch.setattr(dedup, "RECENT", 40)
    monkeypatch.setattr(dedup, "RECENT_SHARE", 2)
    rng = random.Random(8)
    store = open_store(str(db))
    n = 30
    store.add_links([Link(f"http://a/{i}", "http://a", 0) for i in range(n)])
    todo = store.take_todo("http://a", 1, n, 0.0)
    signatures: dict[str, bytes] = {}
    merged_at, recent = [], 0
    batch = getattr(store, "write_batch", None)  # PostgreSQL: pipelined, as a fleet writes
    for i, cand in enumerate(todo):
        sig = signatures[cand.url] = rng.randbytes(dedup.PACK.size)
        assert store.find_similar(sig, cand.url, 0.8) is None
        action = CrawlAction(cand, "http://a", ExitCode.OK, 0.0)
        action.near_signature = sig
        if batch is not None:
            assert batch([Write(action=action, run=1)]) == []
        else:
            store.record(action, 1)
        store.flush()
        before, recent = recent, rows(db, "SELECT COUNT(*) AS n FROM near_dup_recent")[0]["n"]
        if recent < before:  # merged (a batch's own keys wait for the next merge)
            merged_at.append(i)
    if store.keys_staged:
        # 8 keys a page: merged at 40 keys (5 pages), then at 40 (a half of 40, but at least
        # 40), 60 (a half of 120: 8 pages)
        assert merged_at == [4, 9, 14, 22], merged_at
    else:  # PostgreSQL: straight into the index
        assert merged_at == [] and recent == 0
    assert rows(db, f"SELECT COUNT(*) AS n FROM {BAND_KEYS}")[0]["n"] == n * dedup.BANDS
    for url in (todo[0].url, todo[-1].url):  # one merged, one recent
        copy = bytearray(signatures[url])
        copy[-2:] = b"\xff\xff"
        found = store.find_similar(bytes(copy), "http://a/new", 0.8)
        assert found is not None and found[0] == url
    for cand in (todo[0], todo[-1]):  # recrawled: the old keys go, from either table
        again = Candidate(cand.id, cand.url, 0, exit_code="OK")
        action = CrawlAction(again, "http://a", ExitCode.OK, 0.0)
        action.near_signature = rng.randbytes(dedup.PACK.size)
        store.record(action, 2)
        store.flush()
        keys = rows(db, f"SELECT key FROM {BAND_KEYS} WHERE candidate = ? ORDER BY key", cand.id)
        assert [r["key"] for r in keys] == sorted(dedup.band_keys(action.near_signature))
    assert rows(db, f"SELECT COUNT(*) AS n FROM {BAND_KEYS}")[0]["n"] == n * dedup.BANDS
    store.close()


def test_a_sketch_differs_in_no_more_values_than_its_signature() -> None:
    """The sketch holds each value's low 2 bits; a signature whose sketch differs in more values
    than min_similarity allows is never similar enough, and the filter passes all others."""
    rng = random.Random(9)
    for _ in range(300):
        a = rng.randbytes(dedup.PACK.size)
        b = bytearray(a)
        for i in rng.sample(range(dedup.BINS), rng.randrange(dedup.BINS // 2)):
            b[2 * i:2 * i + 2] = rng.randbytes(2)
        values = dedup.PACK.unpack(bytes(b))
        packed = bytes(sum((values[4 * j + k] & 3) << 2 * k for k in range(4))
                       for j in range(dedup.BINS // 4))
        assert dedup.sketch(bytes(b)) == packed
        threshold = rng.choice((0.7, 0.8, 0.9))
        near = dedup.sketch_filter(a, threshold)(dedup.sketch(bytes(b)))
        if dedup.similarity(a, bytes(b)) >= threshold:
            assert near
        differing = sum(x & 3 != y & 3 for x, y in zip(dedup.PACK.unpack(a), values,
                                                         strict=True))
        assert near == (1 - differing / dedup.BINS >= threshold)
    assert dedup.sketch_filter(a, 0.8)(None)  # a row written before sketches: read its signature


def test_band_keys_are_as_stored_by_earlier_versions() -> None:
    """A stored key must not change: each band's xxh64 (seeded with its number), signed."""
    rng = random.Random(13)
    for _ in range(200):
        sig = rng.randbytes(dedup.PACK.size)
        width = 2 * dedup.ROWS
        unsigned = [xxhash.xxh64_intdigest(sig[i * width:(i + 1) * width], seed=i)
                    for i in range(dedup.BANDS)]
        assert dedup.band_keys(sig) == tuple(u - (1 << 64) if u >> 63 else u for u in unsigned)


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
