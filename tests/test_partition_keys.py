"""The hot tables by partition (migration 13; docs/distributed.md, sharding by partition): on
PostgreSQL each row carries its URL's partition and the keys name it; SQLite's schema is as it
was. A database of schema 12 opens with it, losing nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from courtly.model import Link
from courtly.site import Page, html
from courtly.store.postgres import PostgresStore
from courtly.store.schema import HOT_TABLES, MIGRATIONS, PART_FROM_CANDIDATE, PART_FROM_URL
from courtly.urls import origin_of, partition_of
from tests.conftest import UNDO_MIGRATION_17, courtly, execute, rows, undo_migration_13
from tests.pgserver import PgUrl

BACKENDS = ("sqlite", "postgres")  # the `db` tests run on both (tests/conftest.py)

TEXT = "a page long enough to have a near-duplicate signature of its own " * 8
#: what each hot table holds, as schema 12 had it (a row's identity, not its partition)
CONTENTS = {
    "candidates": "url, state, score", "crawl_log": "id, url, exit_code",
    "content": "url, content_hash", "redirects": "url, target", "revisits": "url, fetched",
    "near_dup": "candidate, signature", "near_dup_keys": "key, candidate",
    "near_dup_recent": "key, candidate",  # (SQLite's keys wait here for their merge)
}
#: the unique keys of the hot tables on PostgreSQL: by URL, the partition first; by a serial id
#: or a band key (looked up across partitions), the partition last
KEYS = {
    ("candidates", "candidates_pkey"): ["id", "part"],
    ("candidates", "candidates_url_key"): ["part", "url"],
    ("crawl_log", "crawl_log_pkey"): ["id", "part"],
    ("content", "content_pkey"): ["part", "url"],
    ("redirects", "redirects_pkey"): ["part", "url"],
    ("revisits", "revisits_pkey"): ["part", "url", "fetched"],
    ("near_dup", "near_dup_pkey"): ["candidate", "part"],
    ("near_dup_keys", "near_dup_keys_6_pkey"): ["key", "candidate", "part"],
    ("near_dup_recent", "near_dup_recent_pkey"): ["key", "candidate", "part"],
}
#: the frontier's indexes and the log's by URL: the partition first
INDEXES = {
    "cand_fresh": "(part, origin, score DESC, id, url, depth, state)",
    "cand_queued": "(part, origin, taken_run)",
    "cand_due": "(part, origin, next_due)",
    "crawl_log_url": "(part, url)",
}


def two_sites(serve: Any) -> Any:
    """Two origins: pages, an exact duplicate, a redirect, a link across."""
    one: dict[str, Page] = {}
    two: dict[str, Page] = {}
    site = serve({"one": one, "two": two})  # filled once their URLs are known
    one.update({
        "/": Page(html("one", ["/a", "/dup", "/moved", site.url("two")])),
        "/a": Page(html("A", [], body="one " + TEXT)),
        "/dup": Page(html("A", [], body="one " + TEXT)),
        "/moved": Page(status=301, headers={"Location": "/a"}),
    })
    two.update({
        "/": Page(html("two", ["/b"])),
        "/b": Page(html("B", [], body="two " + TEXT)),
    })
    return site


def crawl(db: Any, *seeds: str) -> None:
    run = courtly("crawl", *seeds, "--db", db, "--min-delay", "0", "--force-recrawl",
                  "--progress", "off")
    assert run.status == 0, run.err


def held(db: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Each hot table's rows (their schema 12 columns), sorted."""
    return {table: sorted(tuple(r.values()) for r in rows(db, f"SELECT {cols} FROM {table}"))
            for table, cols in CONTENTS.items()}


def full(tables: dict[str, list[tuple[Any, ...]]]) -> bool:
    """Every hot table holds rows (the band keys: merged or recent)."""
    rest = {t: v for t, v in tables.items() if t not in ("near_dup_keys", "near_dup_recent")}
    return bool(tables["near_dup_keys"] + tables["near_dup_recent"]) and all(rest.values())


def misplaced(db: PgUrl) -> list[Any]:
    """Rows whose part is not their URL's partition (nor their origin's `origins.part`)."""
    count = rows(db, "SELECT COUNT(*) AS n FROM leases")[0]["n"]
    wrong: list[Any] = []
    for table, column in [("candidates", "url"), ("crawl_log", "url"), *PART_FROM_URL.items()]:
        wrong += [(table, r) for r in rows(db, f"SELECT part, {column} AS url FROM {table}")
                  if r["part"] != partition_of(origin_of(r["url"]), count)]
    for table, column in PART_FROM_CANDIDATE.items():
        wrong += rows(db, f"SELECT x.* FROM {table} x JOIN candidates c ON c.id = x.{column} "
                          "WHERE x.part <> c.part")
    wrong += rows(db, "SELECT c.url FROM candidates c JOIN origins o ON o.origin = c.origin "
                      "WHERE o.part IS DISTINCT FROM c.part")
    return wrong


def unique_keys(db: PgUrl) -> dict[tuple[str, str], list[str]]:
    """The primary and unique keys of the hot tables: their columns in order."""
    found = rows(db, "SELECT t.relname AS tbl, k.conname AS name, ARRAY(SELECT a.attname "
                     "FROM unnest(k.conkey) WITH ORDINALITY AS c(num, i) JOIN pg_attribute a "
                     "ON a.attrelid = k.conrelid AND a.attnum = c.num ORDER BY c.i) AS cols "
                     "FROM pg_constraint k JOIN pg_class t ON t.oid = k.conrelid "
                     "WHERE t.relnamespace = current_schema()::regnamespace "
                     "AND k.contype IN ('p', 'u')")
    return {(r["tbl"], r["name"]): list(r["cols"]) for r in found if r["tbl"] in HOT_TABLES}


def index_columns(db: PgUrl) -> dict[str, str]:
    """The frontier's indexes: their columns as pg_indexes shows them."""
    found = rows(db, "SELECT indexname, indexdef FROM pg_indexes "
                     "WHERE schemaname = current_schema()")
    return {r["indexname"]: r["indexdef"].split(" USING btree ")[1].split(" WHERE ")[0]
            for r in found if r["indexname"] in INDEXES}


def test_a_database_of_schema_12_opens_and_crawls(serve, db: Any, tmp_path: Path) -> None:
    site = two_sites(serve)
    one, two = site.origins["one"], site.origins["two"]
    crawl(db, site.url("one"), site.url("two"))
    crawl(db)  # a recrawl: the same bodies are revisits of the kept ones
    execute(db, *UNDO_MIGRATION_17, *undo_migration_13(db),
            "UPDATE schema_version SET version = 12")
    postgres = str(db).startswith("postgresql://")
    if postgres:  # an origin whose partition was not stored yet: its rows are given it later
        execute(db, f"UPDATE origins SET part = NULL WHERE origin = '{two}'")
    before = held(db)
    assert full(before), before

    assert courtly("stats", "--db", db).status == 0  # opens: migrated
    assert rows(db, "SELECT version FROM schema_version") == [{"version": len(MIGRATIONS)}]
    assert held(db) == before  # nothing lost
    if postgres:
        assert unique_keys(db) == KEYS and index_columns(db) == INDEXES
        parts = {r["part"] for r in rows(db, "SELECT DISTINCT part FROM candidates "
                                             "WHERE origin = ?", two)}
        assert parts == {-1}  # not known at the migration: the next worker to join gives it
    else:  # one machine's schema is as it was: no partition column, the same keys
        assert not [r for r in rows(db, "PRAGMA table_info(candidates)") if r["name"] == "part"]

    crawl(db)
    after = held(db)
    assert {u for u, *_ in after["candidates"]} == {u for u, *_ in before["candidates"]}
    assert len(after["crawl_log"]) > len(before["crawl_log"])
    assert len(after["revisits"]) > len(before["revisits"])
    assert {r["url"] for r in rows(db, "SELECT url FROM candidates WHERE state = 'CRAWLED'")} \
        >= {one + "/", one + "/a", two + "/", two + "/b"}
    if postgres:
        assert misplaced(db) == []


def test_hot_keys_name_the_partition_and_rows_carry_theirs(serve, pg_url: PgUrl) -> None:
    """On PostgreSQL every unique key of a hot table holds `part` (Citus's distribution column
    must be in each), those by URL and the frontier's indexes first; every row written by a
    fleet's worker carries its URL's partition."""
    site = two_sites(serve)
    crawl(pg_url, site.url("one"), site.url("two"))
    crawl(pg_url)
    assert unique_keys(pg_url) == KEYS
    assert index_columns(pg_url) == INDEXES
    assert full(held(pg_url))
    assert misplaced(pg_url) == []


def test_seeds_added_before_any_worker_get_their_partition_when_one_joins(
        pg_url: PgUrl) -> None:
    """Seeds added before the crawl has partitions (add-seeds before the first worker) are
    written with part -1; the first worker to join gives them theirs, and every store learns
    the partition count."""
    origins = ["http://a.example", "http://b.example"]
    store = PostgresStore(pg_url)
    try:
        store.add_origins(origins, seed=True)
        store.add_links([Link(o + "/", o, 0, 1.0) for o in origins])
        assert {r["part"] for r in rows(pg_url, "SELECT part FROM candidates")} == {-1}
        joining = PostgresStore(pg_url)
        try:
            assert joining.ensure_partitions(8) == 8
        finally:
            joining.close()
        store.add_links([Link(origins[0] + "/later", origins[0], 1, 0.5)])
        found = {r["url"]: r["part"] for r in rows(pg_url, "SELECT url, part FROM candidates")}
        assert found == {origins[0] + "/": partition_of(origins[0], 8),
                         origins[1] + "/": partition_of(origins[1], 8),
                         origins[0] + "/later": partition_of(origins[0], 8)}
    finally:
        store.close()
