"""Read-only access to a crawl database, for the live view and the report (courtly.view).

A connection of its own that cannot write: SQLite opened `mode=ro` with `query_only`, PostgreSQL
in a read-only session. Every query here is bounded (by a LIMIT, an index range, or the size of
the fleet) except `origins` and `candidates_by_state`, whose callers cache them by their cost.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from courtly.errors import one_line
from courtly.model import ERRORS
from courtly.store.base import StoreError
from courtly.store.schema import MIGRATIONS

#: the exit codes counted as errors (model.ERRORS), as an SQL list of literals
_ERROR_CODES = ", ".join(f"'{code}'" for code in sorted(ERRORS))
_LOG_COLUMNS = (  # url and detail only for errors
    "id, started, elapsed, exit_code, origin, http_status, content_length, "
    f"CASE WHEN exit_code IN ({_ERROR_CODES}) THEN url END, "
    f"CASE WHEN exit_code IN ({_ERROR_CODES}) THEN detail END"
)
#: stopped workers are listed this long after they stopped
WORKERS_SHOWN_FOR = 3600.0


@dataclass(slots=True)
class LogRow:
    """One crawl_log row (url and detail only for errors)."""

    id: int
    started: float
    elapsed: float
    exit_code: str
    origin: str
    http_status: int | None
    content_length: int | None
    url: str | None
    detail: str | None


@dataclass(slots=True)
class OriginRow:
    """One origins row, as the view shows it."""

    origin: str
    configured: bool
    robots_status: int | None
    robots_error: str | None
    crawl_delay: float | None
    backoff_until: float
    backoff_level: int
    finished_run: int | None


class Reader:
    """Queries a crawl database without changing it; errors are StoreError (one line)."""

    shared = False  # a PostgreSQL fleet's database

    def __init__(self, where: str) -> None:
        self.where = where

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def now(self) -> float:
        """The database's clock (leases and heartbeats are in it)."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the connection."""
        raise NotImplementedError

    def log_after(self, after: int, limit: int, also: Sequence[int] = ()) -> list[LogRow]:
        """Crawl log rows with an id above `after` (at most `limit`), and those with ids in
        `also`, in id order."""
        sql = f"SELECT {_LOG_COLUMNS} FROM crawl_log WHERE id > ? ORDER BY id LIMIT ?"
        rows = self._rows(sql, (after, limit))
        if also:
            marks = ", ".join("?" * len(also))
            rows = self._rows(f"SELECT {_LOG_COLUMNS} FROM crawl_log WHERE id IN ({marks})",
                              list(also)) + rows
        try:
            return [LogRow(int(r[0]), float(r[1]), float(r[2]), str(r[3]), str(r[4]),
                           None if r[5] is None else int(r[5]),
                           None if r[6] is None else int(r[6]),
                           None if r[7] is None else str(r[7]),
                           None if r[8] is None else str(r[8])) for r in rows]
        except (TypeError, ValueError):
            raise StoreError(f"{self.where} is damaged: a crawl_log row cannot be read") from None

    def origins(self) -> list[OriginRow]:
        """Every origin the database knows (cost: the number of origins)."""
        rows = self._rows(
            "SELECT origin, configured, robots_status, robots_error, crawl_delay, backoff_until, "
            "backoff_level, finished_run FROM origins ORDER BY origin"
        )
        out = []
        for r in rows:
            try:
                out.append(OriginRow(str(r[0]), bool(r[1]), _int(r[2]), _str(r[3]), _float(r[4]),
                                     float(r[5] or 0), int(r[6] or 0), _int(r[7])))
            except (TypeError, ValueError):
                continue  # a damaged row is left out of the view
        return out

    def last_run(self) -> tuple[int, float, float | None] | None:
        """The latest run: (id, started, finished or None)."""
        rows = self._rows("SELECT id, started, finished FROM runs ORDER BY id DESC LIMIT 1")
        if not rows:
            return None
        run, started, finished = rows[0]
        return int(run), float(started), _float(finished)

    def candidates_by_state(self) -> dict[str, int]:
        """Crawl candidates by link state (cost: the number of candidates)."""
        rows = self._rows("SELECT state, COUNT(*) FROM candidates GROUP BY state")
        return {str(state): int(n) for state, n in rows}

    def fleet(self) -> dict[str, Any]:
        """The workers (live ones, and those stopped in the last hour), their leases and rates.

        Bounded: one row a worker, one lease row a partition, and each worker's crawl log of
        the last minute (an index range).
        """
        if not self.shared:
            return {"fleet": False, "partitions": 0, "free_partitions": 0, "workers": []}
        now = self.now()
        leases = dict(self._rows(
            "SELECT worker, COUNT(*) FROM leases WHERE worker IS NOT NULL AND expires > ? "
            "GROUP BY worker", (now,)))
        parts = int(self._rows("SELECT COUNT(*) FROM leases")[0][0])
        workers = []
        for wid, host, pid, started, beat, busy, stopped, lease_s, actions in self._rows(
            "SELECT id, host, pid, started, heartbeat, busy, stopped, lease_seconds, actions "
            "FROM workers WHERE stopped IS NULL OR stopped > ? ORDER BY started",
            (now - WORKERS_SHOWN_FOR,),
        ):
            recent = int(self._rows(
                "SELECT COUNT(*) FROM crawl_log WHERE worker = ? AND started > ?",
                (wid, now - 60))[0][0])
            alive = stopped is None and beat > now - lease_s
            state = ("busy" if busy else "idle") if alive else (
                "stopped" if stopped is not None else "lost")
            span = max(1e-9, float(beat) - float(started))
            workers.append({
                "worker": str(wid), "host": str(host), "pid": int(pid), "state": state,
                "leases": int(leases.get(wid, 0)), "actions": int(actions),
                "rate": round(int(actions) / span, 2),
                "rate_last_minute": round(recent / max(1.0, min(60.0, now - started)), 2),
                "heartbeat_age": round(now - float(beat), 1),
            })
        held = sum(int(n) for n in leases.values())
        return {"fleet": True, "partitions": parts, "free_partitions": parts - held,
                "workers": workers}


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


class SqliteReader(Reader):
    """A SQLite crawl database opened read-only (usable from one thread at a time)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        if Path(path).is_dir():  # as the other commands say it (SQLite: "disk I/O error")
            raise StoreError(f"database path is a directory: {path}")
        uri = f"{Path(path).resolve().as_uri()}?mode=ro"
        try:
            self._db = sqlite3.connect(uri, uri=True, timeout=5.0, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read {path}: {exc}") from None
        try:
            self._db.execute("PRAGMA query_only = 1")
            # connecting reads nothing: a file that is not SQLite is refused here, not in
            # each of `courtly serve`'s answers (503s from a server that then ran for nothing)
            version = self._version()
        except sqlite3.Error as exc:
            self._db.close()
            raise StoreError(f"cannot read {path}: {exc}") from None
        if version > len(MIGRATIONS):  # its tables may mean other things than ours
            self._db.close()
            raise StoreError(f"{path} was written by a newer courtly (schema {version})")

    def _version(self) -> int:
        """The schema's version (0: none recorded, a file courtly did not make)."""
        tables = self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        if ("schema_version",) not in tables:
            return 0
        (version,) = self._db.execute("SELECT MAX(version) FROM schema_version").fetchone()
        return version if isinstance(version, int) else 0

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read {self.where}: {exc}") from None

    def now(self) -> float:
        from courtly import clock

        return clock.now()

    def close(self) -> None:
        self._db.close()


class PostgresReader(Reader):
    """A PostgreSQL crawl database in a read-only session."""

    shared = True

    def __init__(self, url: str) -> None:
        import psycopg
        from psycopg import sql as pgsql

        from courtly.store.postgres import conninfo_and_schema, shown_url

        super().__init__(shown_url(url))
        conninfo, schema = conninfo_and_schema(url)
        try:
            self._conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=10,
                                         application_name="courtly:view")
            self._conn.execute("SET default_transaction_read_only = on")
            if schema:
                self._conn.execute(pgsql.SQL("SET search_path TO {}").format(
                    pgsql.Identifier(schema)))
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to {self.where}: {one_line(exc)}") from None

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        query = sql.replace("%", "%%").replace("?", "%s")
        try:
            return self._conn.execute(query, tuple(params)).fetchall()
        except psycopg.Error as exc:
            raise StoreError(f"cannot read {self.where}: {one_line(exc)}") from None

    def now(self) -> float:
        from courtly.store.postgres import NOW

        return float(self._rows(f"SELECT {NOW}")[0][0])

    def close(self) -> None:
        self._conn.close()


def open_reader(db: str) -> Reader:
    """A read-only reader of the crawl database at a path or a postgresql:// URL."""
    if db.startswith(("postgresql://", "postgres://")):
        return PostgresReader(db)
    return SqliteReader(db)
