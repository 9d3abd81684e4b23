"""PostgreSQL's side of a crawl action's writes: the plans its statements are cached with, and how
a page's body is stored (migration 14; docs/distributed.md)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.adapt import PyFormat, Transformer

from courtly.model import Link
from courtly.store.postgres import PostgresStore, conninfo_and_schema
from courtly.urls import origin_of, partition_of
from tests.conftest import rows
from tests.pgserver import PgUrl

PARTS = 8
URL = "http://a.example/p/7.html"
#: a crawl action's candidate update and retry, as the database thread sends their rows
CRAWLED = ("CRAWLED", 1, 1e9, 2e9, "OK", 200, True, None, True, None, "0f" * 16, "text/html",
           5000, None, None, None, None, 86400.0)
RETRY = ("RATE_LIMITED", 503, "Retry-After: 60")


def generic_plan(db: PgUrl, statement: str, row: tuple[Any, ...]) -> str:
    """The plan PostgreSQL caches for a statement after its first executions (a generic plan),
    prepared with the types psycopg gives the row's values, as the database thread prepares it."""
    conninfo, schema = conninfo_and_schema(str(db))
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        tx = Transformer(conn)
        tx.dump_sequence(row, [PyFormat.AUTO] * len(row))
        types = [conn.execute("SELECT %s::regtype::text", (oid,)).fetchone()[0] if oid
                 else "unknown" for oid in tx.types or ()]  # None's: inferred, as libpq's 0
        parts = statement.split("?")
        numbered = parts[0] + "".join(f"${i}{rest}" for i, rest in enumerate(parts[1:], 1))
        conn.execute(f"PREPARE probe ({', '.join(types)}) AS {numbered}")
        explain = psycopg.ClientCursor(conn)
        explain.execute(f"EXPLAIN EXECUTE probe({', '.join(['%s'] * len(row))})", row)
        return "\n".join(line for line, in explain.fetchall())


def test_a_crawl_actions_update_finds_its_candidate_by_a_whole_key(pg_url: PgUrl) -> None:
    """Before the table's first ANALYZE (a new fleet's first minute: autovacuum's), the cached
    plan of a crawl action's candidate update matches a unique key whole. With `id` and `part`
    alone it tied with `(part, url)`'s prefix (the id a filter), and every update read the
    whole partition."""
    store = PostgresStore(pg_url)
    try:
        store.ensure_partitions(PARTS)
        origin = origin_of(URL)
        store.add_origins([origin], seed=True)
        store.add_links([Link(f"{origin}/p/{i}.html", origin, 1, 0.5) for i in range(300)])
        key = (7, partition_of(origin, PARTS), URL)
        for statement, values in ((store._CRAWLED, CRAWLED), (store._RETRY, RETRY)):
            plan = generic_plan(pg_url, statement, values + key)
            cond = next(line for line in plan.splitlines() if "Index Cond" in line)
            assert "part = " in cond and ("url = " in cond or "id = " in cond), plan
    finally:
        store.close()
    assert rows(pg_url, "SELECT reltuples FROM pg_class WHERE relname = 'candidates' "
                        "AND relnamespace = current_schema()::regnamespace") == [
        {"reltuples": -1}]  # never analyzed: the case above


def test_a_stored_body_stays_in_its_row_as_it_came(pg_url: PgUrl) -> None:
    """Bodies and exchanges are stored zstd-compressed: PostgreSQL neither compresses them again
    nor moves one of a few KB to the TOAST table."""
    PostgresStore(pg_url).close()  # migrated
    storage = rows(pg_url, "SELECT c.relname, a.attname, a.attstorage FROM pg_attribute a "
                           "JOIN pg_class c ON c.oid = a.attrelid WHERE c.relnamespace = "
                           "current_schema()::regnamespace AND a.atttypid = 'bytea'::regtype "
                           "AND c.relname IN ('content', 'revisits')")
    assert {(r["relname"], r["attname"]): r["attstorage"] for r in storage} == {
        ("content", "body"): "e", ("content", "exchange"): "e", ("revisits", "exchange"): "e"}
    options = rows(pg_url, "SELECT reloptions FROM pg_class WHERE relname = 'content' "
                           "AND relnamespace = current_schema()::regnamespace")
    assert options == [{"reloptions": ["toast_tuple_target=8160"]}]
