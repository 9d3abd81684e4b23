"""The frontier in the crawl database: todo lists come from the indexes (docs/crawl-loop.md)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from courtly.model import Link
from courtly.store.keyed import keyed
from courtly.store.schema import MIGRATIONS
from courtly.store.sql import FRESH_TODO
from courtly.store.sqlite import SqliteStore
from tests.conftest import UNDO_MIGRATION_17, UNDO_MIGRATIONS_11_12

ORG = "http://a.test"
FRESH_QUERY = "EXPLAIN QUERY PLAN " + keyed(FRESH_TODO, False)  # SQLite's own statement


def fill(path: Path, n: int) -> None:
    store = SqliteStore(str(path))
    store.add_origins([ORG], seed=True)
    store.add_links([Link(f"{ORG}/p/{i}", ORG, i % 7, (i * 37 % 101) / 101) for i in range(n)])
    store.close()


def todo_urls(path: Path, limit: int) -> list[tuple[str, int, float]]:
    store = SqliteStore(str(path))
    run = store.begin_run()
    todo = store.take_todo(ORG, run, limit, time.time())
    store.close()
    return [(c.url, c.depth, c.score) for c in todo]


def test_fresh_candidates_are_read_from_the_index_alone_best_score_first(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    fill(db, 500)
    plan = sqlite3.connect(db).execute(FRESH_QUERY, (ORG, 10)).fetchall()
    assert "COVERING INDEX cand_fresh" in plan[0][3]
    todo = todo_urls(db, 50)
    scores = [score for _, _, score in todo]
    assert len(todo) == 50 and scores == sorted(scores, reverse=True)
    best = sorted(range(500), key=lambda i: (-(i * 37 % 101), i))[:50]  # ties: oldest first
    assert todo == [(f"{ORG}/p/{i}", i % 7, (i * 37 % 101) / 101) for i in best]


def test_a_database_of_schema_6_gets_the_covering_index_and_the_same_todo_list(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.db"
    fill(db, 300)
    before = todo_urls(db, 40)
    con = sqlite3.connect(db)  # back to schema 6: the index of before, without url and depth
    con.execute("DROP INDEX cand_fresh")
    con.execute("CREATE INDEX cand_fresh ON candidates (origin, score DESC, id) "
                "WHERE state = 'NOT_CRAWLED'")
    con.execute("ALTER TABLE origins DROP COLUMN robots_error")  # added by migration 8
    con.execute("ALTER TABLE content DROP COLUMN exchange")  # added by migration 9
    con.execute("DROP TABLE revisits")
    con.execute("ALTER TABLE leases DROP COLUMN epoch")  # added by migration 10
    for statement in (*UNDO_MIGRATIONS_11_12, *UNDO_MIGRATION_17):
        con.execute(statement)
    con.execute("UPDATE schema_version SET version = 6")
    con.commit()
    assert "COVERING" not in con.execute(FRESH_QUERY, (ORG, 10)).fetchall()[0][3]
    con.close()
    assert todo_urls(db, 40) == before  # opening it migrated it
    con = sqlite3.connect(db)
    assert "COVERING INDEX cand_fresh" in con.execute(FRESH_QUERY, (ORG, 10)).fetchall()[0][3]
    assert con.execute("SELECT version FROM schema_version").fetchone()[0] == len(MIGRATIONS)
