"""The embedded SQLite crawl database (the default backend)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from courtly.store.base import StoreError
from courtly.store.schema import Postgres
from courtly.store.sql import SqlStore


class SqliteStore(SqlStore):
    """Crawl database in one SQLite file (WAL mode).

    Each crawl action's results are written atomically; with a commit interval, the actions of
    that many seconds share one commit (group commit), which is what makes SQLite fast: a crash
    or a failed write loses at most that window, whose URLs are crawled again on resume.
    """

    commit_interval = 0.0  # seconds; 0: every write commits at once
    #: SQLite's OR IGNORE: ON CONFLICT DO NOTHING kept the old copy of every page a statement
    #: wrote (its statement journal; NOT NULL could abort it): 70 MB for a merge of the
    #: near-duplicate index at 1.2 million keys, 10 % of a page's band-key insert
    insert_ignoring = "INSERT OR IGNORE INTO {}"
    _batch_since: float | None = None
    _crawl_lock: int | None = None  # a descriptor of the file, flock-ed while a crawl runs

    def __init__(self, path: str) -> None:
        self.path = path
        if Path(path).is_dir():
            raise StoreError(f"database path is a directory: {path}")
        if not Path(path).parent.is_dir():  # SQLite: "unable to open database file"
            raise StoreError(f"cannot create database {path}: no directory {Path(path).parent}")
        try:
            self._db = sqlite3.connect(path, timeout=5.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA cache_size=-65536")  # 64 MiB: the indexes stay hot
            # a multi-row statement's undo copies (its statement journal) go to memory, not to a
            # temporary file (a write call per page changed: half the near-duplicate index's cost)
            self._db.execute("PRAGMA temp_store=MEMORY")
            # a checkpoint every 40 MB of log, not every 4 MB: a page rewritten by many group
            # commits is copied into the database once (COMMIT 39 -> 28 us a page, RESULTS.md)
            self._db.execute("PRAGMA wal_autocheckpoint=10000")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(_explain(exc, path)) from None

    def begin_run(self) -> int:
        self.claim()
        return super().begin_run()

    def claim(self) -> None:
        """One crawl at a time on a database: a second would double every origin's request rate
        (`courtly crawl` claims the file before it writes its seeds)."""
        if self._crawl_lock is None:
            fd = os.open(self.path, os.O_RDONLY)
            try:  # flock, not fcntl: SQLite's own fcntl locks on the file are not touched
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise StoreError(f"another courtly crawl is running on {self.path} "
                                 "(one crawl at a time per database file)") from None
            self._crawl_lock = fd  # released when the store is closed, or by the kernel

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
        return _Transaction(self)

    def flush(self, age: float = 0.0) -> None:
        """Commit the open group of writes, if any and at least `age` seconds old."""
        since = self._batch_since
        if since is not None and time.monotonic() - since >= age:
            self._batch_since = None
            if not self._db.in_transaction:
                return  # SQLite already rolled it back after an error
            try:
                self._db.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self.rolled_back()
                raise StoreError(_explain(exc, self.path)) from None

    def _has_table(self, name: str) -> bool:
        query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        return self._x(query, (name,)).fetchone() is not None

    def _ddl(self, statement: str) -> str:
        """PostgreSQL's statements are not SQLite's (one machine: no partition column)."""
        if isinstance(statement, Postgres):
            return ""
        return statement.replace("BIGSERIAL_PK", "INTEGER PRIMARY KEY").replace(
            "WITHOUT_ROWID", "WITHOUT ROWID"
        )

    def close(self) -> None:
        """Commit what is pending and close the connection."""
        try:
            self.flush()
        finally:
            self._db.close()
            if self._crawl_lock is not None:  # after SQLite is done with the file: closing a
                os.close(self._crawl_lock)  # descriptor drops the process's fcntl locks on it
                self._crawl_lock = None


class _Transaction:
    """One atomic write: BEGIN IMMEDIATE … COMMIT, or a part of the open group commit.

    SQLite errors become StoreError; a failed write is rolled back, never half applied: inside a
    group, the whole group is (no savepoint per action, which cost each action a copy of every
    page it touched; a failed write stops the crawl, and the group's URLs are crawled again on
    resume, as after kill -9).
    """

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._db = store._db

    def __enter__(self) -> None:
        store = self._store
        if store._batch_since is not None:
            return
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            raise StoreError(_explain(exc, store.path)) from None
        if store.commit_interval > 0:
            store._batch_since = time.monotonic()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        store = self._store
        if kind is None:
            try:
                if store._batch_since is None:
                    self._db.execute("COMMIT")
                else:
                    store.flush(store.commit_interval)
                return
            except sqlite3.DatabaseError as err:  # COMMIT failed (flush rolls back itself)
                exc = err
        store._batch_since = None
        store.rolled_back()  # the group may hold other writes the store remembers
        if self._db.in_transaction:  # else SQLite rolled it back already (disk full, …)
            self._db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.DatabaseError):
            raise StoreError(_explain(exc, store.path)) from None


def read_only(path: str | Path) -> contextlib.closing[sqlite3.Connection]:
    """A connection that cannot change the file (for looking at a file before trusting it)."""
    uri = f"{Path(path).resolve().as_uri()}?mode=ro"
    return contextlib.closing(sqlite3.connect(uri, uri=True))


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
