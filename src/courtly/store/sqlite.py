"""The embedded SQLite crawl database (the default backend)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from courtly.store.base import StoreError
from courtly.store.sql import SqlStore


class SqliteStore(SqlStore):
    """Crawl database in one SQLite file (WAL mode, one transaction per crawl action)."""

    def __init__(self, path: str) -> None:
        self.path = path
        if Path(path).is_dir():
            raise StoreError(f"database path is a directory: {path}")
        try:
            self._db = sqlite3.connect(path, timeout=5.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
            _test_pragmas(self._db)
        except sqlite3.DatabaseError as exc:
            raise StoreError(_explain(exc, path)) from None

    def _x(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, params)
        except sqlite3.DatabaseError as exc:
            raise StoreError(_explain(exc, self.path)) from None

    def _xmany(self, sql: str, rows: list[tuple[Any, ...]]) -> int:
        before = self._db.total_changes
        try:
            self._db.executemany(sql, rows)
        except sqlite3.DatabaseError as exc:
            raise StoreError(_explain(exc, self.path)) from None
        return self._db.total_changes - before

    def _tx(self) -> _Transaction:
        return _Transaction(self._db, self.path)

    def _ddl(self, statement: str) -> str:
        return statement.replace("BIGSERIAL_PK", "INTEGER PRIMARY KEY")

    def close(self) -> None:
        """Close the connection."""
        self._db.close()


class _Transaction:
    """BEGIN IMMEDIATE … COMMIT, rolling back on error and turning SQLite errors into StoreError."""

    def __init__(self, db: sqlite3.Connection, path: str) -> None:
        self._db = db
        self._path = path

    def __enter__(self) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            raise StoreError(_explain(exc, self._path)) from None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if kind is None:
            try:
                self._db.execute("COMMIT")
                return
            except sqlite3.DatabaseError as err:
                exc = err
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.DatabaseError):
            raise StoreError(_explain(exc, self._path)) from None


def _test_pragmas(db: sqlite3.Connection) -> None:
    """Hidden test knob: COURTLY_TEST_SQLITE_PRAGMAS="max_page_count=60;query_only=1" simulates
    a full disk (SQLITE_FULL) or an unwritable file (SQLITE_READONLY) without root tricks."""
    for pragma in os.environ.get("COURTLY_TEST_SQLITE_PRAGMAS", "").split(";"):
        name, _, value = pragma.partition("=")
        if name.strip().isidentifier() and value.strip().isdigit():
            db.execute(f"PRAGMA {name.strip()} = {int(value)}")


def _explain(exc: sqlite3.DatabaseError, path: str) -> str:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return f"database {path} is locked by another process"
    if "disk is full" in text or "full" in text:
        return f"disk full while writing {path}"
    if "readonly" in text or "unable to open" in text:
        return f"cannot write database {path}: {text}"
    if "not a database" in text or "malformed" in text:
        return f"{path} is not a courtly database or is damaged: {text}"
    return f"database error on {path}: {text}"
