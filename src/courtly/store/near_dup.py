"""The near-duplicate index in portable SQL: band keys, their buckets, and the search among them
(docs/duplicates.md; the fingerprints themselves: courtly.dedup)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from courtly import dedup
from courtly.store.keyed import Keyed

#: the pages that share a band key, at most dedup.MEMBERS a key (the first indexed: a bucket's
#: representatives), with their sketches: one index probe per key. Bounded whatever the crawl's
#: size: templated pages share keys by chance. For a database many workers write (their inserts
#: may race past MEMBERS), which stages no keys (PostgreSQL: keys_staged is False, and
#: migration 15 merged what it staged before)
_SHARING_A_KEY = " UNION ALL ".join(
    f"SELECT * FROM (SELECT key, candidate, sketch FROM near_dup_keys WHERE key = ? "
    f"LIMIT {dedup.MEMBERS}) AS band{i}" for i in range(dedup.BANDS)
)


@functools.cache
def _sharing_a_key_alone(indexed: int, recent: int) -> str:
    """_SHARING_A_KEY for a database only this store writes, whose buckets it keeps at MEMBERS:
    plain probes (a LIMIT's subquery costs 1 us each) of the keys each table's filter may hold,
    the index's first, then the recent table's."""
    return " UNION ALL ".join(
        ["SELECT key, candidate, sketch FROM near_dup_keys WHERE key = ?"] * indexed
        + ["SELECT key, candidate, sketch FROM near_dup_recent WHERE key = ?"] * recent
    )


#: no bucket full (most pages)
_NONE_FULL: frozenset[int] = frozenset()


def _full(rows: list[tuple[int, int, Any]]) -> frozenset[int]:
    """The band keys of these rows (key, candidate, sketch) whose buckets hold dedup.MEMBERS."""
    if len(rows) < dedup.MEMBERS:
        return _NONE_FULL
    members: dict[int, int] = {}
    for key, _, _ in rows:
        members[key] = members.get(key, 0) + 1
    return frozenset(k for k, n in members.items() if n >= dedup.MEMBERS)


def own_similarity(signature: bytes, stored: Any) -> float | None:
    """How similar a page is to its own last version, as stored (None: damaged, so unknown)."""
    try:
        return dedup.similarity(signature, _signature(stored))
    except ValueError:  # replaced when the page is recorded
        return None


def _signature(value: Any) -> bytes:
    """A stored MinHash signature: bytes of the signature's size (ValueError otherwise)."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ValueError("not a blob")
    data = bytes(value)
    if len(data) != dedup.PACK.size:
        raise ValueError("not a signature's size")
    return data


class NearDupIndex:
    """A store's near-duplicate index: pages' signatures, their band keys (the recent ones in a
    small table, merged into the index in key order), and find_similar."""

    if TYPE_CHECKING:  # the store's (store/sql.py)
        shared: bool
        insert_ignoring: str
        parted: bool

        def _x(self, sql: str, params: Sequence[Any] = ()) -> Any: ...
        def _xmany(self, sql: str, rows: list[tuple[Any, ...]]) -> int: ...
        def _cell(self, table: str, column: str, row: str, convert: Callable[[Any], Any],
                  value: Any) -> Any: ...

    #: a page's band keys go to near_dup_recent, merged into near_dup_keys in key order (a
    #: SQLite commit writes every page of the B-tree that a key dirties), or straight into
    #: near_dup_keys (PostgreSQL writes a dirtied page at checkpoints, not at commits: staging
    #: wrote each key twice, 37 % of a crawl's WAL; bench/RESULTS.md)
    keys_staged = True
    _KEY_ROWS = Keyed(" (key, candidate, sketch[[, part]]) VALUES ")  # the INSERT's columns
    _KEY_ROW = Keyed("(?, ?, ?[[, ?]])")  # and one row's values
    _OLD_SIGNATURE = Keyed("SELECT signature FROM near_dup WHERE candidate = ?[[ AND part = ?]]")
    _SIGNATURE = Keyed(
        "INSERT INTO near_dup (candidate, signature[[, part]]) VALUES (?, ?[[, ?]]) "
        "ON CONFLICT (candidate[[, part]]) DO UPDATE SET signature = excluded.signature")
    _KEYS_OF = Keyed("DELETE FROM {} WHERE candidate = ?[[ AND part = ?]]")
    _KEY_OF = Keyed("DELETE FROM {} WHERE key = ? AND candidate = ?[[ AND part = ?]]")
    _MERGE = Keyed("near_dup_keys (key, candidate, sketch[[, part]]) SELECT key, candidate, "
                   "sketch[[, part]] FROM near_dup_recent WHERE 1 = 1 ORDER BY key")

    @property
    def _keys_table(self) -> str:
        return "near_dup_recent" if self.keys_staged else "near_dup_keys"

    @property
    def _key_tables(self) -> tuple[str, ...]:
        """The tables a page's keys may be in (PostgreSQL stages none: migration 15)."""
        return ("near_dup_keys", "near_dup_recent") if self.keys_staged else ("near_dup_keys",)

    @functools.cached_property
    def _insert_keys(self) -> str:
        """A page's band keys in one statement."""
        return self.insert_ignoring.format(
            self._keys_table + self._KEY_ROWS + ", ".join([self._KEY_ROW] * dedup.BANDS))

    @functools.cached_property
    def _crowded(self) -> dict[bytes, frozenset[int]]:
        """The band keys whose buckets find_similar saw full, by signature (the last pages'
        lookups, until they are recorded)."""
        return {}

    @functools.cached_property
    def _recent_keys(self) -> list[int]:
        """How many keys near_dup_recent holds, as this store counts them (a one-item list)."""
        return [int(self._x("SELECT COUNT(*) FROM near_dup_recent").fetchone()[0])]

    def _looked_up(self, signature: bytes, full: frozenset[int]) -> None:
        """A page's lookup saw these band keys' buckets full (remembered until it is recorded)."""
        crowded = self._crowded
        if len(crowded) >= 4096:  # pages looked up and not yet recorded: as many as in flight
            del crowded[next(iter(crowded))]
        crowded[signature] = full

    def _no_key_shared(self, signature: bytes) -> None:
        """A page's lookup found none of its band keys (no bucket of its is full)."""
        self._looked_up(signature, _NONE_FULL)

    def _forget_index(self) -> None:
        """Writes were rolled back: the counts and filters are read again."""
        for remembered in ("_recent_keys", "_indexed_keys", "_recent_filter", "_index_filter"):
            self.__dict__.pop(remembered, None)

    @functools.cached_property
    def _recent_filter(self) -> dedup.KeyFilter | None:
        """The keys near_dup_recent may hold, for a database only this store writes. None: not
        known (the table held keys when the store opened, or many workers write it)."""
        return None if self.shared or self._recent_keys[0] else dedup.KeyFilter()

    @functools.cached_property
    def _index_filter(self) -> dedup.KeyFilter | None:
        """The keys near_dup_keys may hold, for a database only this store writes (None if many
        workers do): as stored with the last merge, else (a database from before it, or
        damaged) read from the index once. A key is added when it goes to the recent table (a
        lookup may probe the index for it in vain until its merge)."""
        if self.shared:
            return None
        row = self._x("SELECT bits FROM near_dup_filter WHERE id = 1").fetchone()
        found = None if row is None else dedup.KeyFilter.stored(row[0])
        if found is None:
            found = dedup.KeyFilter()
            found.add(self._keys_in("near_dup_keys"))
        return found

    def _keys_in(self, table: str) -> Iterator[int]:
        """Every key of a band-key table (a filter read once, not each lookup)."""
        return (key for key, in self._x(f"SELECT key FROM {table}"))

    @functools.cached_property
    def _indexed_keys(self) -> list[int]:
        """How many keys near_dup_keys holds, as this store counts them (counted when first
        needed, at the first merge; a recrawl's removed keys stay counted)."""
        return [int(self._x("SELECT COUNT(*) FROM near_dup_keys").fetchone()[0])]

    def _sharing_a_key(self, keys: tuple[int, ...]) -> list[tuple[int, int, Any]]:
        """The rows (key, candidate, sketch) of the pages that share a band key (at most
        dedup.MEMBERS a key): on a database only this store writes, probes of the keys its
        filters may hold alone (most pages' keys: none)."""
        indexed, recent = self._index_filter, self._recent_filter
        if indexed is None:  # many workers write it, straight into near_dup_keys
            return list(self._x(_SHARING_A_KEY, keys))
        probed = indexed.holding(keys)
        newer = keys if recent is None else recent.holding(keys)
        if not probed and not newer:
            return []
        return list(self._x(_sharing_a_key_alone(len(probed), len(newer)), [*probed, *newer]))

    def _save_signature(self, candidate: int, signature: bytes, crawled_before: bool,
                        indexed: bool, part: tuple[int, ...] = ()) -> None:
        """Store a page's MinHash signature and, if `indexed` (an OK page), its band keys with
        its sketch (in the caller's transaction); a key whose bucket already holds dedup.MEMBERS
        pages is not added (a lookup compares no more). `part`: the store's _part_param.

        The keys go to near_dup_recent, a small table whose pages stay in the cache, moved into
        near_dup_keys in key order every dedup.RECENT keys (_merge_recent_keys); or, unless
        keys_staged, straight to near_dup_keys.

        A page crawled before may have a signature: its keys are replaced. A first crawl has none
        to read (a second worker crawling it after a lost lease only leaves unused keys).
        """
        old = None
        if crawled_before:
            old = self._x(self._OLD_SIGNATURE, (candidate,) + part).fetchone()
        if old is not None:
            try:
                keys = dedup.band_keys(_signature(old[0]))
            except ValueError:  # damaged: its keys are found by candidate instead
                for table in self._key_tables:
                    self._x(self._KEYS_OF.format(table), (candidate,) + part)
            else:
                for table in self._key_tables:
                    self._xmany(self._KEY_OF.format(table),
                                [(key, candidate) + part for key in keys])
        self._x(self._SIGNATURE, (candidate, signature) + part)
        crowded = self._crowded.pop(signature, None)
        if not indexed:
            return
        keys = dedup.band_keys(signature)
        if crowded is None:  # not looked up, or too long ago: the buckets are counted now
            crowded = _full(self._sharing_a_key(keys))
        added = [key for key in keys if key not in crowded]
        if not added:
            return
        recent = self._recent_keys if self.keys_staged else None  # counted before these are
        if (newer := self._recent_filter) is not None:
            newer.add(added)
        if (merged := self._index_filter) is not None:
            merged.add(added)  # before their merge: no filters to join then (1 MiB integers)
        sketch = dedup.sketch(signature)
        if len(added) == dedup.BANDS:
            self._x(self._insert_keys,
                    [v for key in added for v in (key, candidate, sketch) + part])
        else:
            self._xmany(
                self.insert_ignoring.format(self._keys_table + self._KEY_ROWS + self._KEY_ROW),
                [(key, candidate, sketch) + part for key in added])
        if recent is None:
            return
        recent[0] += len(added)
        # merged when they are RECENT and a 1 / RECENT_SHARE of the index: a merge writes about
        # every page of the index, so a key costs as many page writes whatever the index's size
        if recent[0] >= dedup.RECENT and recent[0] * dedup.RECENT_SHARE >= self._indexed_keys[0]:
            self._merge_recent_keys()
            self._indexed_keys[0] += recent[0]
            recent[0] = 0

    def _merge_recent_keys(self) -> None:
        """Move near_dup_recent's keys into near_dup_keys, in key order: each page of the large
        B-tree that receives keys is written once for all of them, not once per key. The
        index's filter gains them, stored with them."""
        indexed = self._index_filter
        if indexed is not None:
            if self._recent_filter is None:  # keys from before this store opened: not in it
                indexed.add(self._keys_in("near_dup_recent"))
            self._x("INSERT INTO near_dup_filter (id, bits) VALUES (1, ?) ON CONFLICT (id) "
                    "DO UPDATE SET bits = excluded.bits", (bytes(indexed.bits),))
            self._recent_filter = dedup.KeyFilter()
        self._x(self.insert_ignoring.format(self._MERGE))
        self._x("DELETE FROM near_dup_recent")

    def find_similar(
        self, signature: bytes, url: str, min_similarity: float
    ) -> tuple[str, float] | None:
        found = self._sharing_a_key(dedup.band_keys(signature))
        self._looked_up(signature, _full(found))
        if not found:
            return None
        sketches = {other: sketch for _, other, sketch in found}
        # a page whose sketch differs in too many values cannot be similar enough: only the
        # others' signatures are read (a row written before sketches has none: read)
        near = dedup.sketch_filter(signature, min_similarity)
        others = [other for other, sketch in sketches.items() if near(sketch)]
        if not others:
            return None
        marks = ", ".join("?" * len(others))
        scores: dict[int, float] = {}
        for other, stored in self._x(
            f"SELECT candidate, signature FROM near_dup WHERE candidate IN ({marks})", others
        ).fetchall():
            try:
                scores[other] = dedup.similarity(signature, _signature(stored))
            except ValueError:  # damaged: this page's own is replaced when it is recorded
                row = self._x("SELECT url FROM candidates WHERE id = ?", (other,)).fetchone()
                if row is None or row[0] != url:
                    name = str(row[0]) if row is not None else f"candidate {other}"
                    self._cell("near_dup", "signature", name, _signature, stored)
        # the most similar OK page other than this one (a recrawled page finds its own keys)
        for other, score in sorted(scores.items(), key=lambda item: -item[1]):
            if score < min_similarity:
                break
            row = self._x("SELECT url, exit_code FROM candidates WHERE id = ?", (other,)).fetchone()
            if row is not None and row[0] != url and row[1] == "OK":
                return str(row[0]), score
        return None
