"""The crawl database logic in portable SQL, shared by the SQLite and PostgreSQL backends."""

from __future__ import annotations

import contextlib
import functools
import json
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from courtly import clock
from courtly.model import (
    Candidate,
    CrawlAction,
    ExitCode,
    Link,
    LinkState,
    OriginState,
    StoredPage,
    StoredRevisit,
    link_state,
)
from courtly.store.base import StoreError
from courtly.store.keyed import Keyed
from courtly.store.near_dup import NearDupIndex, own_similarity
from courtly.store.schema import MIGRATIONS
from courtly.store.seen import SeenCache

#: the revisits whose original is still the kept page they revisited
REVISITS = (
    "SELECT r.url, r.fetched, r.exchange, r.refers_to, r.refers_to_date, c.body, "
    "c.exchange "
    "FROM revisits r JOIN content c ON c.url = r.refers_to AND c.fetched = r.refers_to_date"
)
#: another crawled page with this content (parameters: the hash, the page's own URL)
SAME_HASH = "content_hash = ? AND url <> ? AND exit_code = 'OK'"
EXPORT_COLUMNS = (
    "url", "origin", "state", "exit_code", "http_status", "last_crawl", "next_due",
    "content_type", "content_length", "redirect_target", "canonical", "duplicate_of",
    "depth", "score", "etag", "last_modified", "content_hash", "detail",
)

#: a column's type: a conversion that raises TypeError or ValueError for a value it cannot hold
#: (SQLite lets any column hold any type, so a hand-edited database can hold anything)
Convert = Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


def _optional(convert: Convert) -> Convert:
    """convert, for a column that may be NULL."""
    return lambda value: None if value is None else convert(value)


def _finite(value: Any) -> float:
    """A time or a delay (NaN or infinity are damage)."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(number)
    return number


def _blob(value: Any) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError(value)
    return value


def _url_list(value: Any) -> list[str]:
    urls = json.loads(value)
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise TypeError(urls)
    return urls


def _object(value: Any) -> dict[str, Any]:
    data = json.loads(value)
    if not isinstance(data, dict):
        raise TypeError(data)
    return data


#: the columns take_todo reads, as Candidate holds them
_TODO_COLUMNS: dict[str, Convert] = {
    "id": int, "url": _same, "depth": int, "score": float, "etag": _same,
    "last_modified": _same, "content_hash": _same, "attempts": int,
    "recrawl_interval": _optional(float), "exit_code": _same,
}
#: the typed columns of a candidate's record (`candidate`)
_RECORD_COLUMNS: dict[str, Convert] = {
    "state": LinkState, "http_status": _optional(int), "last_crawl": _optional(float),
    "next_due": _optional(float), "content_length": _optional(int), "depth": int,
    "score": float,
}
#: the origins columns OriginState holds after its origin, in its order
_ORIGIN_COLUMNS: dict[str, Convert] = {
    "robots_body": _optional(_blob), "robots_status": _optional(int),
    "robots_fetched": _optional(_finite), "crawl_delay": _optional(_finite),
    "backoff_until": _finite, "backoff_level": int, "sitemaps": _url_list,
    "metadata": _object, "robots_error": _optional(str), "last_request": _optional(_finite),
}


#: the candidates an origin's todo list takes, in this order (docs/crawl-loop.md): put back for a
#: retry, never crawled, due again; the fleet asks "has this origin work?" with the same three
#: (postgres.py). {c}: the table's alias and a dot, or nothing; {run}, {due}: placeholders;
#: {retaken}: more conditions under which a URL taken in this run may be taken again
TAKEABLE = (
    "{c}state = 'QUEUED' AND ({c}taken_run IS NULL OR {c}taken_run <> {run}{retaken})",
    "{c}state = 'NOT_CRAWLED'",
    "{c}state IN ('CRAWLED', 'ERROR') AND {c}next_due <= {due}"
    " AND ({c}taken_run IS NULL OR {c}taken_run <> {run})",
)
_RETRIED, _FRESH, _DUE = (t.format(c="", run="?", due="?", retaken="") for t in TAKEABLE)
#: an origin's never-crawled candidates, best first: read from the index cand_fresh alone (it
#: holds url and depth too; the other columns are at their defaults). Parameters: (its
#: partition,) origin, limit
#: (a template: store/keyed.py)
FRESH_TODO = ("SELECT id, url, depth, score, NULL, NULL, NULL, 0, NULL, NULL FROM candidates "
              f"WHERE [[part = ? AND ]]origin = ? AND {_FRESH} ORDER BY score DESC, id LIMIT ?")


def state_after(action: CrawlAction) -> LinkState:
    """The link state a completed crawl action leaves its candidate in."""
    return link_state(action.exit_code, action.retry)


class SqlBase:
    """SqlStore's foundation in portable SQL ('?' placeholders): statements, transactions, group
    commit, the schema, the origins and the runs; a backend supplies the connection.

    Backends implement `_x` (execute one statement, return a cursor), `_xmany` (execute for many
    rows, return the rows changed), `_tx` (a transaction that turns driver errors into StoreError),
    `_ddl` (adapt a migration statement; "": not for this backend) and `close`.
    """

    path: str
    commit_interval = 0.0
    shared = False  # many workers share the database: a crawl joins the fleet
    #: an INSERT of rows that skips those already there ({}: its table, columns and rows)
    insert_ignoring = "INSERT INTO {} ON CONFLICT DO NOTHING"
    #: the hot tables' rows carry their partition and their keys name it (PostgreSQL; Keyed)
    parted = False
    _UPSERT_LINKS = Keyed(
        "INSERT INTO candidates ([[part, ]]url, origin, depth, score) VALUES ([[?, ]]?, ?, ?, ?) "
        "ON CONFLICT ([[part, ]]url) DO UPDATE SET score = excluded.score "
        "WHERE candidates.state = 'NOT_CRAWLED' AND excluded.score > candidates.score")
    worker: str | None = None  # distributed mode: this worker's id, logged with each action

    def _x(self, sql: str, params: Sequence[Any] = ()) -> Any:
        raise NotImplementedError

    def _read(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """A read the crawl repeats, of a fixed text (a backend may run it a faster way)."""
        return self._x(sql, params)

    def _xmany(self, sql: str, rows: list[tuple[Any, ...]]) -> int:
        raise NotImplementedError

    def _tx(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _ddl(self, statement: str) -> str:
        raise NotImplementedError

    def _has_table(self, name: str) -> bool:
        """Whether the crawl's schema has this table."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the connection."""
        raise NotImplementedError

    def stop_reconnecting(self) -> None:
        """Stop waiting for a lost server (only a shared database's store waits for one)."""

    def flush(self, age: float = 0.0) -> None:
        """Commit writes held back by group commit if they are at least `age` seconds old
        (backends without it commit at once)."""

    @functools.cached_property
    def seen(self) -> SeenCache:
        """Link states of recent URLs, kept in step with this store's own writes."""
        return SeenCache()

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """One atomic write (`_tx`); a failed one is rolled back (`rolled_back`)."""
        try:
            with self._tx():
                yield
        except BaseException:
            self.rolled_back()
            raise

    def rolled_back(self) -> None:
        """Writes were rolled back: what this store remembers of its own writes is forgotten."""
        self.seen.clear()

    def _cell(self, table: str, column: str, row: str, convert: Convert, value: Any) -> Any:
        """A value as its column's type; a value that cannot be is a damaged database."""
        try:
            return convert(value)
        except (TypeError, ValueError, OverflowError):
            shown = repr(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise StoreError(
                f"{self.path} is damaged: {table}.{column} of {row} is {shown}"
            ) from None

    def _row(self, table: str, row: str, columns: dict[str, Convert],
             values: Sequence[Any]) -> list[Any]:
        """A row's values as their columns' types (see _cell)."""
        return [self._cell(table, column, row, convert, value)
                for (column, convert), value in zip(columns.items(), values, strict=True)]

    # -- schema --------------------------------------------------------------------------
    def _migrate(self) -> None:
        # outside a write transaction: when the table exists this takes no write lock, so
        # `stats` and `export` do not wait for a crawl's group commit to end
        self._x("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        rows = self._x("SELECT version FROM schema_version").fetchall()
        if len(rows) > 1:
            raise StoreError(f"{self.path} is damaged: schema_version has {len(rows)} rows")
        if not rows and self._has_table("origins"):  # its row deleted: not a new database
            raise StoreError(f"{self.path} is damaged: schema_version is empty, yet the crawl's "
                             "tables are there")
        version = rows[0][0] if rows else 0
        if type(version) is not int or version < 0:
            raise StoreError(f"{self.path} is damaged: schema_version.version is {version!r}")
        if version > len(MIGRATIONS):
            raise StoreError(f"{self.path} was written by a newer courtly (schema {version})")
        for number in range(version, len(MIGRATIONS)):
            with self._tx():
                for statement in MIGRATIONS[number]:
                    if adapted := self._ddl(statement):  # "": not for this backend
                        self._x(adapted)
                self._x("DELETE FROM schema_version")
                self._x("INSERT INTO schema_version VALUES (?)", (number + 1,))

    # -- origins and runs ----------------------------------------------------------------
    def add_origins(self, origins: list[str], seed: bool = False) -> None:
        with self._tx():
            self._configure(origins, seed)

    def _configure(self, origins: list[str], seed: bool) -> None:
        self._xmany(
            "INSERT INTO origins (origin, seed) VALUES (?, ?) ON CONFLICT (origin) DO UPDATE "
            "SET configured = 1, seed = CASE WHEN excluded.seed = 1 THEN 1 ELSE origins.seed "
            "END",
            [(o, int(seed)) for o in origins],
        )

    def configured_origins(self) -> list[str]:
        rows = self._x("SELECT origin FROM origins WHERE configured = 1 ORDER BY origin")
        return [r[0] for r in rows]

    def seed_origins(self) -> list[str]:
        rows = self._x("SELECT origin FROM origins WHERE seed = 1 ORDER BY origin")
        return [r[0] for r in rows]

    def add_links(self, links: list[Link]) -> int:
        if not links:
            return 0
        with self._write():
            return self._insert_links(links)

    def _insert_links(self, links: list[Link]) -> int:
        links = self.seen.new_links(links)  # the upserts that could change something
        if not links:
            return 0
        return self._xmany(self._UPSERT_LINKS, self._link_rows(links))

    def _link_rows(self, links: list[Link]) -> list[tuple[Any, ...]]:
        """The candidates upsert's rows of these links."""
        return [(lk.url, lk.origin, lk.depth, lk.score) for lk in links]

    def _part_param(self, origin: str) -> tuple[int, ...]:
        """A hot statement's partition parameter for a row of this origin: none (SQLite's hot
        tables have no partition column)."""
        return ()

    def _url_part_param(self, url: str) -> tuple[int, ...]:
        """_part_param for a row of this URL."""
        return ()

    def begin_run(self) -> int:
        with self._tx():
            row = self._x(
                "SELECT id, stopped FROM runs WHERE finished IS NULL ORDER BY id DESC LIMIT 1"
            ).fetchone()
            if row is not None:
                run = int(row[0])
                if row[1] is None:  # its last process was killed: it may have asked any origin
                    self._x("UPDATE origins SET last_request = ?", (clock.now(),))
                self._x("UPDATE runs SET stopped = NULL WHERE id = ?", (run,))
                # URLs that were in a todo list or in flight at the stop are taken again
                self._x(
                    "UPDATE candidates SET taken_run = NULL WHERE state = 'QUEUED' "
                    "AND taken_run = ?",
                    (run,),
                )
                return run
            row = self._x(
                "INSERT INTO runs (started) VALUES (?) RETURNING id", (clock.now(),)
            ).fetchone()
            return int(row[0])

    def make_due(self, run: int, now: float) -> None:
        with self._tx():
            self._x("UPDATE candidates SET next_due = ? WHERE state IN ('CRAWLED', 'ERROR') "
                    "AND next_due > ? AND (taken_run IS NULL OR taken_run <> ?)",
                    (now, now, run))

    def end_run(self, run: int, last_requests: dict[str, float], finished: bool) -> None:
        with self._tx():
            self._xmany("UPDATE origins SET last_request = ? WHERE origin = ?",
                       [(at, origin) for origin, at in last_requests.items()])
            column = "finished" if finished else "stopped"
            self._x(f"UPDATE runs SET {column} = ? WHERE id = ?", (clock.now(), run))


class SqlReads(SqlBase):
    """What users read of the crawl database: stats, export, stored pages and revisits."""

    #: 200 stored pages after a key (their partition and) URL, in that order
    _PAGES = Keyed(
        "SELECT c.url, c.fetched, k.content_type, c.body, c.exchange[[, c.part]] FROM content c "
        "LEFT JOIN candidates k ON [[k.part = c.part AND ]]k.url = c.url "
        "WHERE ([[c.part, ]]c.url) > ([[?, ]]?) ORDER BY [[c.part, ]]c.url LIMIT 200")
    _CANDIDATE = Keyed(f"SELECT {', '.join(EXPORT_COLUMNS)} FROM candidates "
                       "WHERE [[part = ? AND ]]url = ?")

    def stats(self) -> dict[str, Any]:
        def grouped(sql: str) -> dict[str, int]:
            return {str(k): int(v) for k, v in self._x(sql).fetchall()}

        by_origin: dict[str, dict[str, int]] = {}
        for origin, state, n in self._x(
            "SELECT origin, state, COUNT(*) FROM candidates GROUP BY origin, state"
        ):
            by_origin.setdefault(origin, {})[state] = n
        return {
            "candidates": int(self._x("SELECT COUNT(*) FROM candidates").fetchone()[0]),
            "by_state": grouped("SELECT state, COUNT(*) FROM candidates GROUP BY state"),
            "by_exit_code": grouped(
                "SELECT exit_code, COUNT(*) FROM candidates WHERE exit_code IS NOT NULL "
                "GROUP BY exit_code"
            ),
            "actions_by_exit_code": grouped(
                "SELECT exit_code, COUNT(*) FROM crawl_log GROUP BY exit_code"
            ),
            "by_origin": by_origin,
            "runs": int(self._x("SELECT COUNT(*) FROM runs").fetchone()[0]),
        }

    def export(self) -> Iterator[dict[str, Any]]:
        cur = self._x(f"SELECT {', '.join(EXPORT_COLUMNS)} FROM candidates ORDER BY id")
        for row in cur:
            yield dict(zip(EXPORT_COLUMNS, row, strict=True))

    def stored_pages(self) -> Iterator[StoredPage]:
        # pages of 200 by key: the bodies never all in memory (psycopg reads a whole result at
        # once); the key: (the partition and) the URL
        after: tuple[Any, ...] = (-2, "") if self.parted else ("",)
        while True:
            rows = self._x(self._PAGES, after).fetchall()
            for url, fetched, content_type, body, exchange, *_ in rows:
                try:
                    yield StoredPage(str(url), float(fetched), content_type, bytes(body),
                                     None if exchange is None else bytes(exchange))
                except (TypeError, ValueError):  # a damaged row: an empty body, which the
                    yield StoredPage(str(url), 0.0, None, b"")  # WARC writer reports
            if len(rows) < 200:
                return
            after = (*rows[-1][5:], rows[-1][0])

    def stored_revisits(self) -> Iterator[StoredRevisit]:
        """The revisits of pages still kept as they were, by URL and time (pages of 200)."""
        after: tuple[str, float] = ("", 0.0)
        while True:
            rows = self._x(
                f"{REVISITS} WHERE (r.url > ? OR (r.url = ? AND r.fetched > ?)) "
                "ORDER BY r.url, r.fetched LIMIT 200",
                (after[0], after[0], after[1]),
            ).fetchall()
            yield from self._revisits(rows)
            if len(rows) < 200:
                return
            after = (rows[-1][0], rows[-1][1])

    def revisit(self, url: str, fetched: float) -> StoredRevisit | None:
        """The revisit of this URL recorded at this time, if its page is still kept."""
        rows = self._x(f"{REVISITS} WHERE r.url = ? AND r.fetched = ?", (url, fetched))
        return next(self._revisits(rows.fetchall()), None)

    def _revisits(self, rows: list[Any]) -> Iterator[StoredRevisit]:
        for url, fetched, exchange, refers_to, refers_date, original, kept in rows:
            try:
                yield StoredRevisit(str(url), float(fetched), bytes(exchange), str(refers_to),
                                    float(refers_date), bytes(original),
                                    None if kept is None else bytes(kept))
            except (TypeError, ValueError):  # a damaged row: the WARC writer reports it
                yield StoredRevisit(str(url), 0.0, b"", "", 0.0, b"")

    def candidate(self, url: str) -> dict[str, Any] | None:
        row = self._x(self._CANDIDATE, self._url_part_param(url) + (url,)).fetchone()
        if row is None:
            return None
        record = dict(zip(EXPORT_COLUMNS, row, strict=True))
        for column, convert in _RECORD_COLUMNS.items():
            record[column] = self._cell("candidates", column, url, convert, record[column])
        return record


class SqlRecords(NearDupIndex, SqlReads):
    """The crawl's frontier and its records in portable SQL: todo lists, crawl actions with their
    content and revisits, pages' near-duplicate keys and the search among them, the origins'
    state."""

    _RETRIED_TODO = Keyed(f"SELECT {', '.join(_TODO_COLUMNS)} FROM candidates "
                          f"WHERE [[part = ? AND ]]origin = ? AND {_RETRIED} LIMIT ?")
    _FRESH_TODO = Keyed(FRESH_TODO)
    _DUE_TODO = Keyed(f"SELECT {', '.join(_TODO_COLUMNS)} FROM candidates "
                      f"WHERE [[part = ? AND ]]origin = ? AND {_DUE} ORDER BY next_due LIMIT ?")
    _LOG = Keyed(
        "INSERT INTO crawl_log ([[part, ]]run, url, origin, started, elapsed, exit_code, "
        "http_status, content_type, content_length, detail, worker) "
        "VALUES ([[?, ]]?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
    _MODIFIED = Keyed(
        "UPDATE candidates SET next_due = ? WHERE [[part = ? AND ]]url = ? "
        "AND state IN ('CRAWLED', 'ERROR') AND last_crawl < ? AND next_due > ?")
    _RETRY = Keyed(
        "UPDATE candidates SET state = 'QUEUED', taken_run = NULL, attempts = attempts + 1, "
        "exit_code = ?, http_status = ?, detail = ? WHERE id = ?[[ AND part = ? AND url = ?]]")
    _CRAWLED = Keyed(
        "UPDATE candidates SET state = ?, taken_run = ?, attempts = 0, "
        "last_crawl = ?, next_due = ?, exit_code = ?, http_status = ?, "
        "etag = CASE WHEN ? THEN ? ELSE etag END, "
        "last_modified = CASE WHEN ? THEN ? ELSE last_modified END, "
        "content_hash = COALESCE(?, content_hash), content_type = ?, "
        "content_length = ?, redirect_target = ?, canonical = ?, duplicate_of = ?, "
        "detail = ?, recrawl_interval = ? WHERE id = ?[[ AND part = ? AND url = ?]]")
    _REDIRECT = Keyed(
        "INSERT INTO redirects ([[part, ]]url, target, status, seen) VALUES ([[?, ]]?, ?, ?, ?) "
        "ON CONFLICT ([[part, ]]url) DO UPDATE SET target = excluded.target, "
        "status = excluded.status, seen = excluded.seen")
    _CONTENT = Keyed(
        "INSERT INTO content ([[part, ]]url, content_hash, fetched, body, exchange) "
        "VALUES ([[?, ]]?, ?, ?, ?, ?) ON CONFLICT ([[part, ]]url) DO UPDATE SET "
        "content_hash = excluded.content_hash, fetched = excluded.fetched, "
        "body = excluded.body, exchange = excluded.exchange "
        "WHERE content.content_hash <> excluded.content_hash OR content.exchange IS NULL")
    _REVISIT_KEPT = Keyed(
        "INSERT INTO revisits ([[part, ]]url, fetched, exchange, refers_to, refers_to_date) "
        "SELECT [[?, ]]?, ?, ?, url, fetched FROM content "
        "WHERE [[part = ? AND ]]url = ? AND fetched <> ? ON CONFLICT DO NOTHING")
    _REVISIT_OF = Keyed(
        "INSERT INTO revisits ([[part, ]]url, fetched, exchange, refers_to, refers_to_date) "
        "SELECT [[?, ]]?, ?, ?, refers_to, refers_to_date FROM ("
        "SELECT url AS refers_to, fetched AS refers_to_date, 0 AS pick FROM content "
        "WHERE [[part = ? AND ]]url = ? UNION ALL SELECT * FROM (SELECT refers_to, "
        "refers_to_date, 1 AS pick FROM revisits WHERE [[part = ? AND ]]url = ? "
        "ORDER BY fetched DESC LIMIT 1) AS last"
        ") AS found WHERE 1 = 1 ORDER BY pick LIMIT 1 ON CONFLICT DO NOTHING")

    # -- the frontier --------------------------------------------------------------------
    def take_todo(self, origin: str, run: int, limit: int, now: float) -> list[Candidate]:
        """Read the next candidates; nothing is written (docs/crawl-loop.md, the todo list).

        An origin refills its todo list only when the list is empty, that is when every URL it
        took before has been recorded: what is still NOT_CRAWLED, QUEUED or due is not taken.
        """
        part = self._part_param(origin)
        rows = self._read(self._RETRIED_TODO, part + (origin, run, limit)).fetchall()
        if len(rows) < limit:
            rows += self._read(self._FRESH_TODO, part + (origin, limit - len(rows))).fetchall()
        if len(rows) < limit:
            rows += self._read(
                self._DUE_TODO, part + (origin, now, run, limit - len(rows))).fetchall()
        try:  # the conversions raise on a damaged row (cheaper than checking each value)
            return [
                Candidate(i, url, int(depth), float(score), etag, modified, content_hash,
                          int(attempts), None if interval is None else float(interval), code)
                for i, url, depth, score, etag, modified, content_hash, attempts, interval, code
                in rows
            ]
        except (TypeError, ValueError, OverflowError):
            for r in rows:  # name the damaged row
                self._row("candidates", f"id {r[0]} ({r[1]})", _TODO_COLUMNS, r)
            raise

    def record(self, action: CrawlAction, run: int) -> None:
        with self._write():
            self._record_rows(action, run)
        self.seen.put(action.candidate.url, state_after(action))

    @staticmethod
    def _candidate_key(c: Candidate, part: tuple[int, ...]) -> tuple[Any, ...]:
        """The parameters of `WHERE id = ?[[ AND part = ? AND url = ?]]`: on PostgreSQL the URL
        too, so that a unique key is matched whole however the planner breaks a tie. With
        `id` and `part` alone, a generic plan made before the table's first ANALYZE scanned
        the partition by `(part, url)` and filtered on the id (docs/distributed.md)."""
        return (c.id, *part, c.url) if part else (c.id,)

    def _record_rows(self, action: CrawlAction, run: int) -> None:
        """The statements of one crawl action (in the caller's transaction)."""
        c = action.candidate
        state = state_after(action)
        part = self._part_param(action.origin)
        self._x(
            self._LOG,
            part + (run, c.url, action.origin, action.started, action.elapsed,
                    str(action.exit_code), action.http_status, action.content_type,
                    action.content_length, action.detail, self.worker),
        )
        if action.retry:
            self._x(self._RETRY, (str(action.exit_code), action.http_status, action.detail)
                    + self._candidate_key(c, part))
        else:
            self._x(
                self._CRAWLED,
                (str(state), run, action.started, action.next_due, str(action.exit_code),
                 action.http_status, action.revalidated, action.etag, action.revalidated,
                 action.last_modified,
                 action.content_hash, action.content_type, action.content_length,
                 action.redirect_target, action.canonical, action.duplicate_of,
                 action.detail, action.recrawl_interval) + self._candidate_key(c, part),
            )
        if action.near_signature is not None:
            self._save_signature(c.id, action.near_signature, c.exit_code is not None,
                                 action.exit_code == ExitCode.OK, part)
        if action.redirect_target is not None and action.http_status is not None:
            self._x(self._REDIRECT, part + (c.url, action.redirect_target, action.http_status,
                                     action.started))
        if action.content is not None and action.content_hash is not None:
            self._keep(action, part)
        elif action.revisit_of is not None and action.exchange is not None:
            self._revisit(action, action.revisit_of, part)
        if action.modified:  # a sitemap's entries changed since their last crawl: due now
            now = action.started
            self._xmany(self._MODIFIED, [(now, *self._url_part_param(url), url, when, now)
                                         for url, when in action.modified])
        if action.links:
            self._insert_links(action.links)
        if action.origin_state is not None:
            self._upsert_origin(action.origin_state)

    def _keep(self, action: CrawlAction, part: tuple[int, ...]) -> None:
        """Keep a page's body and exchange; the same body kept before stays, and this response
        is a revisit of it (in the caller's transaction; statements whose answers are not read,
        so that PostgreSQL's batches send them without waiting). `part`: _part_param's."""
        url, started = action.candidate.url, action.started
        kept = self._x(
            self._CONTENT,
            part + (url, action.content_hash, started, action.content, action.exchange),
        )
        # the row kept is an older fetch: a revisit of it; a cursor that saw this fetch's row
        # written (SQLite; a PostgreSQL batch reads none) saves the look-up, 21,000 instructions,
        # and so does a first crawl (no fetch of it was kept: a crawl action writes its content
        # and its candidate's exit code together)
        if action.exchange is not None and action.candidate.exit_code is not None and (
                kept is None or kept.rowcount != 1):
            self._x(self._REVISIT_KEPT,
                    part + (url, started, action.exchange) + part + (url, started))

    def _revisit(self, action: CrawlAction, original: str, part: tuple[int, ...]) -> None:
        """Record a response as a revisit of the page kept for `original`, or of what that URL's
        last revisit refers to (a 304 of a duplicate); neither: there is nothing to refer to."""
        theirs = self._url_part_param(original)
        self._x(self._REVISIT_OF, part + (action.candidate.url, action.started, action.exchange)
                + theirs + (original,) + theirs + (original,))

    def rolled_back(self) -> None:
        """The near-duplicate index's counts and filters are read again, too."""
        super().rolled_back()
        self._forget_index()

    # -- per-origin state ----------------------------------------------------------------
    def load_origin(self, origin: str) -> OriginState:
        row = self._read(
            f"SELECT {', '.join(_ORIGIN_COLUMNS)} FROM origins WHERE origin = ?", (origin,)
        ).fetchone()
        if row is None:
            return OriginState(origin)
        return OriginState(origin, *self._row("origins", origin, _ORIGIN_COLUMNS, row))

    def save_origin(self, state: OriginState) -> None:
        with self._tx():
            self._upsert_origin(state)

    def add_seeds(self, links: list[Link], metadata: dict[str, dict[str, Any]]) -> int:
        with self._write():
            self._configure(sorted({lk.origin for lk in links}), seed=True)
            added = self._insert_links(links)
            for origin, data in metadata.items():
                state = self.load_origin(origin)
                state.metadata = data
                self._upsert_origin(state)
        return added

    def _upsert_origin(self, state: OriginState) -> None:
        self._x(
            "INSERT INTO origins (origin, configured, robots_body, robots_status, "
            "robots_fetched, crawl_delay, backoff_until, backoff_level, sitemaps, metadata, "
            "robots_error) VALUES (?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (origin) DO "
            "UPDATE SET robots_body = excluded.robots_body, "
            "robots_status = excluded.robots_status, "
            "robots_fetched = excluded.robots_fetched, crawl_delay = excluded.crawl_delay, "
            "backoff_until = excluded.backoff_until, "
            "backoff_level = excluded.backoff_level, "
            "sitemaps = excluded.sitemaps, metadata = excluded.metadata, "
            "robots_error = excluded.robots_error",
            (state.origin, state.robots_body, state.robots_status, state.robots_fetched,
             state.crawl_delay, state.backoff_until, state.backoff_level,
             json.dumps(state.sitemaps), json.dumps(state.metadata), state.robots_error),
        )

class SqlStore(SqlRecords):
    """The Store interface in portable SQL, on SqlBase's statements: SqlRecords, the link states
    of found URLs (the seen cache first), a page's look-ups in one call and the origins' state."""

    # -- link states and look-ups -----------------------------------------------------------
    def states(self, urls: list[str]) -> dict[str, LinkState]:
        out, missing = self.seen.known(dict.fromkeys(urls))
        out.update(self._read_states(missing))
        return out

    def unsettled(self, urls: list[str], score: float) -> list[str]:
        changing, unknown = self.seen.changing(urls, score)
        if not unknown:
            return changing
        self._read_states(unknown)  # the cache now knows them
        return self.seen.changing(changing, score)[0]

    def page_lookups(
        self, content_hash: str | None, signature: bytes | None, url: str,
        min_similarity: float, links: list[str] | None, score: float, own: int | None = None,
    ) -> tuple[str | None, tuple[str, float] | None, list[str] | None, float | None]:
        """What a page's handling asks the database, at once: another URL with its exact
        content (if content_hash), else a near-duplicate (if signature), which of its links
        are unsettled at this score (if links), and how similar it is to its own last version
        (if own: its candidate's id)."""
        original = None if content_hash is None else self.find_hash(content_hash, url)
        similar = None
        if original is None and signature is not None:
            similar = self.find_similar(signature, url, min_similarity)
        itself = None
        if own is not None and signature is not None:
            last = self._x(self._OLD_SIGNATURE, (own,) + self._url_part_param(url)).fetchone()
            itself = None if last is None else own_similarity(signature, last[0])
        return (original, similar, None if links is None else self.unsettled(links, score),
                itself)

    def _read_states(self, missing: list[str]) -> dict[str, LinkState]:
        """The database's states of URLs the seen cache does not know; the cache records them
        (and the absent ones)."""
        out: dict[str, LinkState] = {}
        for i in range(0, len(missing), 500):
            chunk = missing[i:i + 500]
            marks = ", ".join("?" * len(chunk))
            found = self._x(
                f"SELECT url, state, score FROM candidates WHERE url IN ({marks})", chunk
            ).fetchall()
            self._remember(found, out)
        self._absent(missing, out)
        return out

    def _remember(self, found: list[Any], out: dict[str, LinkState]) -> None:
        """(url, state, score) rows read from candidates: into out, and the seen cache."""
        try:
            for url, state, score in found:
                known = out[str(url)] = LinkState(state)
                self.seen.put(str(url), known, float(score))
        except (TypeError, ValueError):
            for url, state, score in found:  # name the damaged row
                self._cell("candidates", "state", str(url), LinkState, state)
                self._cell("candidates", "score", str(url), float, score)
            raise

    def _absent(self, missing: list[str], out: dict[str, LinkState]) -> None:
        """The URLs asked for and not found: the seen cache knows they are not candidates."""
        for url in missing:
            if url not in out:
                self.seen.absent(url)

    def redirect_chain(self, url: str, limit: int) -> int:
        """How many recorded redirects lead to url (walked backwards, at most limit + 1)."""
        hops, seen = 0, {url}
        while hops <= limit:
            # no LIMIT: with it, PostgreSQL prepared a scan of a small redirects table (a LIMIT
            # makes a scan look cheap) and kept that plan as the table grew
            row = self._read("SELECT url FROM redirects WHERE target = ?", (url,)).fetchone()
            if row is None or row[0] in seen:
                break
            url = str(row[0])
            seen.add(url)
            hops += 1
        return hops

    def find_hash(self, content_hash: str, url: str) -> str | None:
        row = self._x(f"SELECT url FROM candidates WHERE {SAME_HASH} LIMIT 1",
                      (content_hash, url)).fetchone()
        return None if row is None else str(row[0])
