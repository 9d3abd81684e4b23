"""The shared PostgreSQL crawl database (psycopg 3), and the fleet's coordination tables.

The crawl logic is SqlStore's portable SQL; this backend translates its '?' placeholders, maps the
migration types, reconnects with backoff when the server goes away, and adds what only a shared
database needs: workers, partition leases (taken with FOR UPDATE SKIP LOCKED) and the fleet's
"is there work left" question. See docs/distributed.md.

URL: any libpq URL; a courtly-specific query parameter `schema=NAME` (stripped before connecting)
puts the crawl in that schema, created if missing. A worker sets how long a lost connection is
retried from `[fleet] reconnect_seconds`.
"""

from __future__ import annotations

import logging
import re
import select
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import unquote

import psycopg
from psycopg import errors
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from courtly import dedup
from courtly.config import FleetConfig
from courtly.errors import one_line
from courtly.model import Link, LinkState, StoredRevisit
from courtly.store.base import ConnectionLost, StoreError, Write
from courtly.store.bulk import BulkSender, wait_for
from courtly.store.near_dup import own_similarity
from courtly.store.schema import PART_FROM_CANDIDATE, PART_FROM_URL
from courtly.store.sql import REVISITS, SAME_HASH, TAKEABLE, SqlStore, state_after
from courtly.urls import origin_of, partition_of

log = logging.getLogger("courtly")

#: the database server's clock, in epoch seconds: every lease and heartbeat time is taken from it
NOW = "EXTRACT(EPOCH FROM clock_timestamp())::float8"
_SCHEMA_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
#: a URL's scheme and user:password@ (libpq reads the user part up to an '@' before any '/')
_USERINFO_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://([^/@]*@)?")


def _work(retaken: str = "") -> str:
    """Takeable work of one origin `o` in run %(run)s: SqlStore.take_todo's three conditions."""
    return "(" + " OR ".join(
        "EXISTS (SELECT 1 FROM candidates c WHERE c.part = o.part AND c.origin = o.origin AND "
        + cond.format(c="c.", run="%(run)s", due="%(due)s", retaken=retaken) + ")"
        for cond in TAKEABLE
    ) + ")"


#: the fence: first statement of every batch of writes; it locks the worker's lease rows FOR KEY
#: SHARE (no other worker takes them before the batch commits: `acquire` selects FOR UPDATE SKIP
#: LOCKED; the worker's own heartbeat, which changes no key, is not held up) and raises
#: LEASE_LOST, which aborts the batch, unless each (partition, epoch) is still this worker's and
#: unexpired
LEASE_LOST = "CL001"
_FENCE = f"""CREATE OR REPLACE FUNCTION courtly_fence(me TEXT, parts INTEGER[], epochs BIGINT[])
RETURNS VOID LANGUAGE plpgsql AS $$
DECLARE held INTEGER;
BEGIN
    SELECT COUNT(*) INTO held FROM (
        SELECT 1 FROM leases l JOIN unnest(parts, epochs) AS f(part, epoch)
            ON l.part = f.part AND l.epoch = f.epoch
        WHERE l.worker = me AND l.expires > {NOW} FOR KEY SHARE OF l) AS valid;
    IF held < cardinality(parts) THEN
        RAISE EXCEPTION 'a lease of worker % expired or passed to another worker', me
            USING ERRCODE = '{LEASE_LOST}';
    END IF;
END $$"""


#: the fence's call in a write batch (its arrays as literals: `_array`)
_FENCE_CALL = "SELECT courtly_fence(%s, %s::integer[], %s::bigint[])"

#: does any of these band keys (%s, an array) have a page: one probe of the index per key (`key
#: = ANY(keys) LIMIT 1` is planned as a scan of the whole table while the table has no
#: statistics, as in a crawl's first minutes: 2 ms a page at 30,000 keys, and growing). The
#: recent keys' table is not probed: PostgreSQL stages none (migration 15 merged the old ones;
#: its empty probes cost 10 us a page)
ANY_KEY = ("SELECT 'k', NULL, NULL, NULL FROM unnest(%s::bigint[]) AS k(key) WHERE EXISTS ("
           "SELECT 1 FROM near_dup_keys n WHERE n.key = k.key) LIMIT 1")

#: a recrawled page's last signature (%s, %s: its candidate's id and partition), as hex text
OWN_SIGNATURE = ("SELECT 'o', encode(signature, 'hex'), NULL, NULL FROM near_dup "
                 "WHERE candidate = %s AND part = %s")
#: the states of these URLs (%s, %s: arrays of their partitions and of them), one probe of the
#: URL index each: `url = ANY(urls)` was prepared as a scan of the whole table while it was
#: small, and a prepared statement keeps its plan (this test server never analyzes: 1-3 ms a
#: page at 22,000 URLs, and growing)
STATES = ("SELECT 's', c.url, c.state, c.score FROM unnest(%s::integer[], %s::text[]) AS "
          "u(part, url) CROSS JOIN LATERAL (SELECT url, state, score FROM candidates "
          "WHERE part = u.part AND url = u.url LIMIT 1) AS c")
#: the rows written while the crawl had no partitions yet (part -1): their origins
_UNPARTED = ("SELECT origin FROM candidates WHERE part = -1 UNION "
             "SELECT origin FROM crawl_log WHERE part = -1")

#: deadlock, serialization failure, a prepared statement gone (psycopg deallocates every one
#: after a ROLLBACK): the batch was rolled back and is sent again
_CONFLICTS = frozenset({"40P01", "40001", "26000"})
_CONFLICT_RETRIES = 10


#: seconds a new connection's first statement waits before a warning line says why: a session
#: pooler (PgBouncer) with no server connection to spare keeps it waiting for one to free
POOL_WAIT = 5.0

#: set by a second signal: every connection of this process stops reconnecting (the crawl's and
#: its fleet's: a process stops as one)
_GIVING_UP = threading.Event()

class _Conflict(StoreError):
    """A batch rolled back by a deadlock with another worker's (sent again)."""


class LeaseLost(StoreError):
    """A batch of writes was refused: one of its leases expired or passed to another worker."""


def conninfo_and_schema(url: str) -> tuple[str, str | None]:
    """The libpq URL without courtly's own `schema` parameter, and that schema (or None).

    The rest of the URL is passed on as written (`postgresql:///db?host=…` keeps its empty
    host); a URL libpq cannot parse is a StoreError.
    """
    base, items = _query(url)
    schemas = [unquote(i.partition("=")[2]) for i in items if _key(i) == "schema"]
    schema = schemas[0] if schemas else None
    if schema is not None and not _SCHEMA_RE.match(schema):
        raise StoreError(f"invalid schema name in database URL: {schema!r}")
    conninfo = _join(base, [i for i in items if _key(i) != "schema"])
    try:
        conninfo_to_dict(conninfo)
    except psycopg.Error as exc:  # libpq quotes the URL, password and all
        why = one_line(exc).replace(conninfo, shown_url(url))
        raise StoreError(f"invalid database URL {shown_url(url)}: {why}") from None
    return conninfo, schema


def shown_url(url: str) -> str:
    """The URL as given, without its user, password or password parameters, for messages."""
    base, items = _query(url)
    userinfo = _USERINFO_RE.match(base)
    if userinfo is not None and userinfo.group(1):
        base = base[:userinfo.start(1)] + base[userinfo.end(1):]
    # a password with an unescaped '/' (base64's) is not the user part libpq reads: whatever
    # precedes an '@' may still be part of it (a database name with an '@' is shown cut short)
    start = base.find("://") + 3
    at = base.rfind("@")
    if at >= start > 2:
        base = base[:start] + base[at + 1:]
    return _join(base, [i for i in items if "password" not in _key(i)])


def _query(url: str) -> tuple[str, list[str]]:
    """A URL up to its query string, and the query's key=value items as written."""
    userinfo = _USERINFO_RE.match(url)
    mark = url.find("?", userinfo.end() if userinfo else 0)
    return (url, []) if mark < 0 else (url[:mark], url[mark + 1:].split("&"))


def _key(item: str) -> str:
    return unquote(item.partition("=")[0])


def _join(base: str, items: list[str]) -> str:
    return f"{base}?{'&'.join(items)}" if items else base


def database_exists(url: str) -> bool:
    """Whether the URL's database (and schema) already holds a courtly crawl; never creates it."""
    conninfo, schema = conninfo_and_schema(url)
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT 1 FROM information_schema.tables WHERE table_name = 'schema_version' "
                "AND table_schema = COALESCE(%s, current_schema())",
                (schema,),
            ).fetchone()
            return row is not None
    except psycopg.OperationalError as exc:
        raise StoreError(f"cannot connect to {shown_url(url)}: {one_line(exc)}") from None
    except psycopg.Error as exc:
        raise _error(exc, shown_url(url)) from None


class PostgresSql(SqlStore):
    """SqlStore's statements on one psycopg connection, reconnected with backoff when lost."""

    shared = True
    keys_staged = False
    parted = True

    def __init__(self, url: str, retry_seconds: float = FleetConfig().reconnect_seconds) -> None:
        self.url = url
        self.path = shown_url(url)
        self._conninfo, self.schema = conninfo_and_schema(url)
        self.retry_seconds = retry_seconds
        self._conn: psycopg.Connection[Any] | None = None
        self._in_tx = False
        self._idle_ms = 5000  # idle_in_transaction_session_timeout
        self._session: list[str] = []  # settings made again on a new connection
        #: write_batch's statements by query, sent by the BulkSender at its end (one pipeline)
        self._batch: dict[str, list[tuple[Any, ...]]] | None = None
        self._sql_cache: dict[str, str] = {}
        self._bulk = BulkSender()
        #: statements sent and round trips waited for (bench/distributed_bench.py reports them)
        self.statements = 0
        self.round_trips = 0
        self._app_name: dict[str, Any] = {} if "application_name" in self._conninfo else {
            "application_name": f"courtly:{self.schema or ''}"}
        self._parts: dict[str, int] = {}  # the partition of each origin written
        self._connect(first=True)
        self._migrate()
        #: the crawl's partition count (0: none yet; fixed when a worker first joins), as read
        #: at the start, by ensure_partitions, or by a write of links while there was none
        self.partitions = 0
        self._learn_partitions()

    # -- connection ------------------------------------------------------------------------
    def _connect(self, first: bool = False) -> psycopg.Connection[Any]:
        """(Re)connect, retrying with exponential backoff for up to retry_seconds."""
        deadline = time.monotonic() + (0 if first else self.retry_seconds)
        pause = 0.25
        while True:
            try:
                conn = self._session_connection()
                if first and _hands_sessions_on(_backend(conn, self.path, self.retry_seconds),
                                                self._session_connection):
                    conn.close()  # before any session setting, which it would hand on
                    raise StoreError(
                        f"{self.path} gives one session's server connection to another between "
                        "transactions (PgBouncer's transaction or statement pooling?): courtly "
                        "needs session pooling (pool_mode = session; docs/distributed.md)")
                if self.schema:
                    conn.execute(
                        pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                            pgsql.Identifier(self.schema)
                        )
                    )
                    conn.execute(
                        pgsql.SQL("SET search_path TO {}").format(pgsql.Identifier(self.schema))
                    )
                # a frozen or lost worker must not hold its locks for long (docs/distributed.md)
                conn.execute(f"SET idle_in_transaction_session_timeout = {self._idle_ms}")
                for setting in self._session:
                    conn.execute(setting)
                self._conn = conn
                return conn
            except psycopg.Error as exc:
                if first or _GIVING_UP.is_set() or time.monotonic() + pause > deadline:
                    if first:
                        raise StoreError(
                            f"cannot connect to {self.path}: {one_line(exc)}") from None
                    how = ("gave up on a second signal" if _GIVING_UP.is_set()
                           else f"retried for {self.retry_seconds:.0f}s")
                    raise ConnectionLost(f"lost the connection to {self.path} ({how}): "
                                         f"{one_line(exc)}", final=True) from None
                log.warning("database %s unreachable, retrying in %.1fs: %s",
                            self.path, pause, one_line(exc))
                _GIVING_UP.wait(pause)  # a second signal ends the wait
                pause = min(pause * 2, 2.0)  # back within 2 s of the server

    def _session_connection(self) -> psycopg.Connection[Any]:
        """A new connection to the server, before any session setting."""
        return psycopg.connect(self._conninfo, autocommit=True, connect_timeout=10,
                               **self._app_name)

    def set_idle_timeout(self, seconds: float) -> None:
        """How long the server lets this session idle inside a transaction (a stopped worker's
        locks go with it); kept across reconnections."""
        self._idle_ms = max(1, int(seconds * 1000))
        self._px(f"SET idle_in_transaction_session_timeout = {self._idle_ms}")

    def commit_lazily(self) -> None:
        """The crawl's own writes commit without waiting for the WAL flush
        (synchronous_commit = off): a server crash loses at most its last few hundred
        milliseconds of crawl actions, whose URLs are crawled again (docs/distributed.md)."""
        self._session.append("SET synchronous_commit = off")
        self._px("SET synchronous_commit = off")

    def reconnect(self) -> None:
        """Drop the connection and connect again (with backoff; ConnectionLost past the limit)."""
        if self._conn is not None:
            with suppress(psycopg.Error):
                self._conn.close()
        self._conn = None
        self._live()

    def _live(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            conn = self._connect()
        return conn

    def _q(self, sql: str) -> str:
        """'?' placeholders to '%s' (and a literal '%' to '%%')."""
        out = self._sql_cache.get(sql)
        if out is None:
            out = self._sql_cache[sql] = sql.replace("%", "%%").replace("?", "%s")
        return out

    def _retrying(self, run: Any, statements: int = 1) -> Any:
        """Run a statement; outside a transaction a lost connection is reconnected and retried
        (inside one it is ConnectionLost: the caller retries the whole transaction)."""
        self.statements += statements
        self.round_trips += self._batch is None
        while True:
            conn = self._live()
            try:
                return run(conn)
            except psycopg.Error as exc:
                if self._batch is not None:
                    raise  # write_batch tells a refused fence from the rest
                if not isinstance(exc, psycopg.OperationalError) or not conn.broken:
                    raise _error(exc, self.path) from None
                if self._in_tx:
                    raise _lost(exc, self.path) from None
                log.warning("database %s: connection lost (%s), reconnecting",
                            self.path, one_line(exc))
                self._conn = None

    def _x(self, sql: str, params: Sequence[Any] = ()) -> Any:
        query = self._q(sql)
        if self._batch is not None and not sql.startswith("SELECT"):  # its answer is not read
            self._batch.setdefault(query, []).append(tuple(params))
            return None
        return self._retrying(lambda conn: conn.execute(query, tuple(params)))

    def _read(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """A read the crawl repeats (a todo list, a redirect chain, an origin's state): prepared
        at its first use and run through libpq directly (BulkSender), not through psycopg's
        cursor (one worker's database thread 110 -> 101 us a page, and it bounds one worker:
        +3-6 % pages/s; bench/RESULTS.md). Not for a statement whose text varies: each text is
        prepared once, and kept."""
        query = self._q(sql)

        def run(conn: psycopg.Connection[Any]) -> _Rows:
            try:
                return _Rows(self._bulk.fetch(conn, [(query, params)])[0])
            except errors.InvalidSqlStatementName:  # deallocated (psycopg after a ROLLBACK):
                return _Rows(self._bulk.fetch(conn, [(query, params)])[0])  # prepared again

        return self._retrying(run)

    def _xmany(self, sql: str, rows: list[tuple[Any, ...]]) -> int:
        if not rows:
            return 0
        query = self._q(sql)
        if self._batch is not None:
            self._batch.setdefault(query, []).extend(rows)
            return len(rows)

        def run(conn: psycopg.Connection[Any]) -> int:
            cur = conn.cursor()
            cur.executemany(query, rows)
            return max(0, cur.rowcount)

        return self._retrying(run, len(rows))  # type: ignore[no-any-return]

    def _px(self, sql: str, params: dict[str, Any] | Sequence[Any] = ()) -> Any:
        """Execute PostgreSQL-specific SQL with psycopg's own %s / %(name)s placeholders."""
        return self._retrying(lambda conn: conn.execute(sql, params))

    @contextmanager
    def _tx(self) -> Iterator[None]:
        """BEGIN … COMMIT; a connection lost at BEGIN is reconnected (with backoff) and retried."""
        if self._in_tx:  # nested: part of the enclosing transaction
            yield
            return
        def begin(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
            conn.execute("BEGIN")
            return conn

        conn: psycopg.Connection[Any] = self._retrying(begin)  # reconnects at BEGIN if lost
        self._in_tx = True
        try:
            yield
        except BaseException:
            self._in_tx = False
            self._bulk.forget()  # psycopg deallocates every prepared statement after a ROLLBACK
            if not conn.broken and not conn.closed:
                with suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
            raise
        self._in_tx = False
        self.statements += 1
        self.round_trips += 1
        try:
            conn.execute("COMMIT")
        except psycopg.Error as exc:
            broken = isinstance(exc, psycopg.OperationalError) and conn.broken
            raise (_lost if broken else _error)(exc, self.path) from None

    def _ddl(self, statement: str) -> str:
        return statement.replace("BIGSERIAL_PK", "BIGSERIAL PRIMARY KEY").replace(
            " WITHOUT_ROWID", ""
        )

    def _has_table(self, name: str) -> bool:
        query = ("SELECT 1 FROM information_schema.tables WHERE table_name = ? "
                 "AND table_schema = current_schema()")
        return self._x(query, (name,)).fetchone() is not None

    def _migrate(self) -> None:
        # one migrating process at a time: workers starting together all open the store
        with self._tx():
            self._px("SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':courtly'))")
            super()._migrate()
            self._retrying(lambda conn: conn.execute(_FENCE))  # no parameters: '%' is literal

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None and not self._conn.closed:
            self._conn.close()

    def stop_reconnecting(self) -> None:
        """Stop reconnecting, this store and every other of the process (a second signal)."""
        _GIVING_UP.set()

    # -- the partition of each row (docs/distributed.md, sharding) ---------------------------
    def _part_of(self, origin: str) -> int:
        """The partition of an origin's rows (-1 while the crawl has none: ensure_partitions
        gives those rows theirs)."""
        part = self._parts.get(origin)
        if part is None:
            if not self.partitions:
                return -1
            part = self._parts[origin] = partition_of(origin, self.partitions)
        return part

    def _learn_partitions(self) -> int:
        """The crawl's partition count, asked (again) while it has none. In a transaction the
        lease rows are locked against their creation first: rows it writes with part -1 are
        committed before the first worker gives them their partition (ensure_partitions)."""
        if self._in_tx and self._batch is None:
            self._px("LOCK TABLE leases IN SHARE MODE")
        self.partitions = int(self._px("SELECT COUNT(*) FROM leases").fetchone()[0])
        return self.partitions

    def _part_param(self, origin: str) -> tuple[int, ...]:
        return (self._part_of(origin),)

    def _url_part_param(self, url: str) -> tuple[int, ...]:
        return (self._url_part(url),)

    def _url_part(self, url: str) -> int:
        """The partition of a URL's rows."""
        try:
            return self._part_of(origin_of(url))
        except ValueError:  # not http(s): no candidate has it
            return -1

    def _link_rows(self, links: list[Link]) -> list[tuple[Any, ...]]:
        """The rows lead with their partition (-1 for all while the crawl has none)."""
        part: Callable[[str], int] = self._part_of
        if not self.partitions and not self._learn_partitions():
            part = _unknown_part
        return [(part(lk.origin), lk.url, lk.origin, lk.depth, lk.score) for lk in links]

    def _read_states(self, missing: list[str]) -> dict[str, LinkState]:
        """One probe of the (partition, URL) index each."""
        out: dict[str, LinkState] = {}
        if missing:
            found = self._px(STATES, (_array(str(self._url_part(u)) for u in missing),
                                      _array(_quoted(u) for u in missing))).fetchall()
            self._remember([r[1:] for r in found], out)
        self._absent(missing, out)
        return out

    def revisit(self, url: str, fetched: float) -> StoredRevisit | None:
        """The revisit's original is found by its partition too: its refers_to asked first."""
        part = self._url_part(url)
        row = self._px("SELECT refers_to FROM revisits WHERE part = %s AND url = %s "
                       "AND fetched = %s", (part, url, fetched)).fetchone()
        if row is None:
            return None
        rows = self._px(f"{REVISITS} WHERE r.part = %s AND r.url = %s AND r.fetched = %s "
                        "AND c.part = %s", (part, url, fetched, self._url_part(str(row[0]))))
        return next(self._revisits(rows.fetchall()), None)



class PostgresBatches(PostgresSql):
    """Many crawl actions a round trip: write batches fenced by leases, a page's look-ups."""

    def write_batch(self, writes: list[Write]) -> list[Write]:
        """Write queued crawl actions and origin states in one transaction sent in one round trip
        (pipeline mode), fenced by their leases; returns the writes refused (their lease was lost:
        nothing of theirs is written)."""
        refused: list[Write] = []
        conflicts = 0
        while writes:
            leases = sorted({w.lease for w in writes if w.lease is not None})
            try:
                self._pipelined(writes, leases)
                break
            except _Conflict as exc:  # another worker's batch locked rows in the other order
                log.info("database %s: %s; the batch is sent again", self.path, exc)
                conflicts += 1
                if conflicts > _CONFLICT_RETRIES:
                    raise
            except LeaseLost:
                valid = set(self.valid_leases(leases))
                refused += [w for w in writes if w.lease is not None and w.lease not in valid]
                writes = [w for w in writes if w.lease is None or w.lease in valid]
        return refused

    def _pipelined(self, writes: list[Write], leases: list[tuple[int, int]]) -> None:
        conn = self._live()
        self._in_tx, self._batch = True, {}
        failure: psycopg.Error | None = None
        try:
            try:
                for w in writes:  # collected; a read among them (a recrawl's old signature)
                    self._write_rows(w)  # runs now, before the transaction
            except psycopg.Error as exc:
                failure = exc
            if failure is None:
                # BEGIN, the fence, every row, COMMIT in one pipeline sent at once (BulkSender);
                # the statements in the order they first came (a crawl action's own order
                # holds: only two actions of one URL could see theirs interleaved, and an origin
                # has at most one action a batch); an upsert's rows in key order (_leading;
                # stable: the last of a key wins), so that two workers' batches lock the
                # rows they share (links to the same URLs) in the same order instead of
                # deadlocking
                for query, rows in self._batch.items():
                    if "ON CONFLICT" in query:
                        rows.sort(key=_leading)
                fence = [(_FENCE_CALL, [(self.worker, _array(str(p) for p, _ in leases),
                                         _array(str(e) for _, e in leases))])] if leases else []
                self.statements += self._bulk.execute(
                    conn, [*fence, *self._batch.items()], b"COMMIT", first=b"BEGIN")
        except psycopg.Error as exc:
            failure = failure or exc
        except BaseException:  # not the database's (a bug, a cancellation): its locks go too
            self._roll_back(conn)
            raise
        finally:
            self._in_tx, self._batch = False, None
        if failure is not None:
            self._roll_back(conn)
            if failure.sqlstate == LEASE_LOST:
                raise LeaseLost(one_line(failure))
            if failure.sqlstate in _CONFLICTS:
                raise _Conflict(one_line(failure))
            broken = isinstance(failure, psycopg.OperationalError) and conn.broken
            raise (_lost if broken else _error)(failure, self.path)
        self.statements += 2
        self.round_trips += 1
        for w in writes:
            if w.action is not None:
                self.seen.put(w.action.candidate.url, state_after(w.action))

    def _roll_back(self, conn: psycopg.Connection[Any]) -> None:
        """A batch failed: nothing of it stays, not even its open transaction's locks."""
        self.rolled_back()
        self._bulk.forget()  # psycopg deallocates every prepared statement after a ROLLBACK
        if not conn.broken and conn.info.transaction_status != TransactionStatus.IDLE:
            with suppress(psycopg.Error):
                conn.execute("ROLLBACK")

    def _write_rows(self, w: Write) -> None:
        if w.action is not None:
            self._record_rows(w.action, w.run)
        elif w.state is not None:
            self._upsert_origin(w.state)
        if w.links:
            self._insert_links(w.links)
        if w.origins:
            self.add_origins(w.origins)

    def committed(self, writes: list[Write]) -> bool:
        """Whether a batch whose COMMIT got no answer was committed (its first crawl action is
        logged); a batch without one is safe to send again."""
        first = next((w.action for w in writes if w.action is not None), None)
        if first is None:
            return False
        row = self._px(
            "SELECT 1 FROM crawl_log WHERE part = %s AND url = %s AND started = %s "
            "AND worker IS NOT DISTINCT FROM %s LIMIT 1",
            (self._part_of(first.origin), first.candidate.url, first.started, self.worker)
        ).fetchone()
        return row is not None

    def page_lookups(
        self, content_hash: str | None, signature: bytes | None, url: str,
        min_similarity: float, links: list[str] | None, score: float, own: int | None = None,
    ) -> tuple[str | None, tuple[str, float] | None, list[str] | None, float | None]:
        """SqlStore.page_lookups in one statement, one round trip (a page sharing a band key
        costs a second one: find_similar)."""
        asked = _Lookup(self, content_hash, signature, url, min_similarity, links, score, own)
        rows = self._px(asked.sql, asked.params).fetchall() if asked.sql else []
        return asked.answer(rows)

    def many_page_lookups(self, calls: list[tuple[Any, ...]]) -> list[Any]:
        """page_lookups of several pages (each call's arguments), their statements sent in one
        pipeline: one round trip for all (the database thread's 18 a wake each waited for the
        server alone). Any error of the database raises it: the caller asks them one by one."""
        asked = [_Lookup(self, *args) for args in calls]
        found = iter(self._bulk.fetch(self._live(), [(a.sql, a.params) for a in asked if a.sql]))
        self.statements += len(calls)
        self.round_trips += 1
        return [a.answer(next(found) if a.sql else []) for a in asked]

    def valid_leases(self, leases: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Which of these (partition, epoch) leases are still this worker's, unexpired."""
        rows = self._px(
            f"SELECT part, epoch FROM leases WHERE worker = %s AND expires > {NOW} "
            "AND part = ANY(%s)", (self.worker, [p for p, _ in leases])).fetchall()
        return [(int(p), int(e)) for p, e in rows if (int(p), int(e)) in leases]



class PostgresStore(PostgresBatches):
    """Crawl database in PostgreSQL, shared by many workers on many machines: the fleet's runs,
    workers and leases besides the crawl."""

    def join_run(self) -> int:
        """The fleet's unfinished run, or a new one (its QUEUED URLs are released per partition)."""
        with self._tx():
            self._px("SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':runs'))")
            row = self._px(
                "SELECT id FROM runs WHERE finished IS NULL ORDER BY id DESC LIMIT 1"
            ).fetchone()
            if row is not None:
                return int(row[0])
            row = self._px(
                f"INSERT INTO runs (started) VALUES ({NOW}) RETURNING id"
            ).fetchone()
            return int(row[0])

    def ensure_partitions(self, count: int) -> int:
        """Create the lease rows once; returns the crawl's partition count (fixed at creation).
        Rows written before (part -1) get their partition."""
        with self._tx():
            self._px("LOCK TABLE leases IN SHARE ROW EXCLUSIVE MODE")
            have = int(self._px("SELECT COUNT(*) FROM leases").fetchone()[0])
            if have == 0:
                self._px(
                    "INSERT INTO leases (part, worker, expires) "
                    "SELECT generate_series(0, %s - 1), NULL, 0", (count,)
                )
                have = count
            self.partitions = have
            self._give_parts()
            return have

    def _give_parts(self) -> None:
        """Give the rows written while the crawl had no partitions (part -1: seeds added before
        the first worker joined, or rows of an origin without one at migration 13) their
        origin's partition: two index probes when there are none."""
        origins = [str(r[0]) for r in self._px(_UNPARTED).fetchall()]
        if not origins:
            return
        pairs = (_array(str(self._part_of(o)) for o in origins),
                 _array(_quoted(o) for o in origins))
        for table in ("candidates", "crawl_log"):
            self._px(f"UPDATE {table} x SET part = v.part FROM unnest(%s::integer[], "
                     "%s::text[]) AS v(part, origin) WHERE x.part = -1 AND x.origin = v.origin",
                     pairs)
        for table, column in PART_FROM_URL.items():
            self._px(f"UPDATE {table} x SET part = c.part FROM candidates c "
                     f"WHERE x.part = -1 AND c.url = x.{column}")
        for table, column in PART_FROM_CANDIDATE.items():
            self._px(f"UPDATE {table} x SET part = c.part FROM candidates c "
                     f"WHERE x.part = -1 AND c.id = x.{column}")

    def register_worker(self, worker: str, host: str, pid: int, settings: str | None = None,
                        ) -> None:
        """Add this worker to the fleet, with the settings it should share with the others."""
        with self._tx():
            self._px(
                f"INSERT INTO workers (id, host, pid, started, heartbeat, busy, actions, "
                f"settings) VALUES (%s, %s, %s, {NOW}, {NOW}, 1, 0, %s) ON CONFLICT (id) DO "
                f"UPDATE SET heartbeat = {NOW}, stopped = NULL, settings = EXCLUDED.settings",
                (worker, host, pid, settings),
            )

    def peer_settings(self, worker: str) -> list[tuple[str, str]]:
        """The other live workers' shared settings (id, JSON; those that recorded them), the
        longest running first."""
        rows = self._px(
            f"SELECT id, settings FROM workers WHERE id <> %s AND stopped IS NULL AND "
            f"settings IS NOT NULL AND heartbeat > {NOW} - lease_seconds ORDER BY started",
            (worker,)).fetchall()
        return [(str(wid), str(settings)) for wid, settings in rows]

    def origins_without_partition(self) -> list[str]:
        """Origins whose partition has not been computed yet."""
        return [r[0] for r in self._px("SELECT origin FROM origins WHERE part IS NULL")]

    def set_partitions(self, parts: list[tuple[int, str]]) -> None:
        """Store (partition, origin) pairs."""
        with self._tx():
            self._xmany("UPDATE origins SET part = ? WHERE origin = ?", parts)

    def stop_workers(self, workers: list[str]) -> None:
        """Mark workers stopped and free their leases (dead on this host, or leaving)."""
        if not workers:
            return
        with self._tx():
            self._px(f"UPDATE workers SET stopped = {NOW}, busy = 0 WHERE id = ANY(%s)",
                     (workers,))
            self._px("UPDATE leases SET worker = NULL, expires = 0 WHERE worker = ANY(%s)",
                     (workers,))

    def fleet(self, host: str, recent: float) -> tuple[list[str], list[tuple[str, int]]]:
        """The live workers (a heartbeat within `recent` seconds; sorted), and the unstopped
        workers recorded on this host."""
        live = self._px(
            f"SELECT id FROM workers WHERE stopped IS NULL AND heartbeat > {NOW} - %s "
            "ORDER BY id", (recent,)).fetchall()
        local = self._px(
            "SELECT id, pid FROM workers WHERE stopped IS NULL AND host = %s", (host,)
        ).fetchall()
        return [str(r[0]) for r in live], [(str(r[0]), int(r[1])) for r in local]

    def members(self) -> tuple[int, float]:
        """The fleet's membership, cheaply: how many workers have not stopped, and the latest
        start among them (changes when a worker joins or leaves; between polls)."""
        row = self._read("SELECT COUNT(*), COALESCE(MAX(started), 0) FROM workers "
                         "WHERE stopped IS NULL").fetchone()
        return int(row[0]), float(row[1])

    def partition_weights(self, run: int) -> dict[int, int]:
        """Each partition's configured origins not finished for this run."""
        rows = self._px(
            "SELECT part, COUNT(*) FROM origins WHERE configured = 1 AND part IS NOT NULL AND "
            "(finished_run IS NULL OR finished_run <> %s) GROUP BY part", (run,)).fetchall()
        return {int(p): int(n) for p, n in rows}

    def lease_holders(self) -> dict[int, str]:
        """The holder of each unexpired lease."""
        rows = self._px(
            f"SELECT part, worker FROM leases WHERE worker IS NOT NULL AND expires > {NOW}"
        ).fetchall()
        return {int(p): str(w) for p, w in rows}

    def heartbeat(
        self, worker: str, lease_seconds: float, actions: int
    ) -> list[tuple[int, int]]:
        """Renew this worker's row and its unexpired leases; returns them (partition, epoch).

        An expired lease is not renewed even if no other worker took it yet: it is taken again
        (a new epoch), so that writes fenced by the old one are refused."""
        with self._tx():
            self._px(
                f"UPDATE workers SET heartbeat = {NOW}, actions = %s, lease_seconds = %s "
                f"WHERE id = %s",
                (actions, lease_seconds, worker),
            )
            rows = self._px(
                f"UPDATE leases SET expires = {NOW} + %s WHERE worker = %s AND expires > {NOW} "
                "RETURNING part, epoch",
                (lease_seconds, worker),
            ).fetchall()
        return sorted((int(r[0]), int(r[1])) for r in rows)

    def set_busy(self, worker: str, busy: bool) -> None:
        """Say whether this worker has (or is about to take) work."""
        with self._tx():
            self._px("UPDATE workers SET busy = %s WHERE id = %s", (int(busy), worker))

    def acquire(
        self, worker: str, run: int, parts: list[int], lease_seconds: float
    ) -> list[tuple[int, int]]:
        """Lease those of these partitions that are free or expired (each with a new epoch), and
        release their QUEUED URLs; returns (partition, epoch) pairs."""
        if not parts:
            return []
        with self._tx():
            rows = self._px(
                f"SELECT part FROM leases WHERE part = ANY(%s) AND (worker IS NULL OR "
                f"expires < {NOW}) ORDER BY part FOR UPDATE SKIP LOCKED", (parts,),
            ).fetchall()
            free = [int(r[0]) for r in rows]
            taken: list[tuple[int, int]] = []
            if free:
                taken = [(int(p), int(e)) for p, e in self._px(
                    f"UPDATE leases SET worker = %s, expires = {NOW} + %s, epoch = epoch + 1 "
                    "WHERE part = ANY(%s) RETURNING part, epoch",
                    (worker, lease_seconds, free),
                ).fetchall()]
                # the previous owner's todo lists and in-flight URLs: taken again by us
                self._px(
                    "UPDATE candidates SET taken_run = NULL WHERE state = 'QUEUED' "
                    "AND taken_run = %s AND part = ANY(%s)",
                    (run, free),
                )
        return sorted(taken)

    def release(self, worker: str, parts: list[int]) -> None:
        """Give partitions back (this worker has nothing in flight for them)."""
        if parts:
            with self._tx():
                self._px(
                    "UPDATE leases SET worker = NULL, expires = 0 "
                    "WHERE worker = %s AND part = ANY(%s)",
                    (worker, parts),
                )

    def origins_with_work(self, parts: list[int], run: int, due: float) -> list[str]:
        """Configured origins of these partitions with takeable work, not given up this run."""
        if not parts:
            return []
        query = (
            "SELECT o.origin FROM origins o WHERE o.configured = 1 AND o.part = ANY(%(parts)s) "
            "AND (o.finished_run IS NULL OR o.finished_run <> %(run)s) AND "
            + _work()
        )
        rows = self._px(query, {"parts": parts, "run": run, "due": due}).fetchall()
        return sorted(r[0] for r in rows)

    def give_up(self, origins: list[str], run: int) -> None:
        """These origins are finished for this run (out of patience, a trap, Crawl-delay cap)."""
        if origins:
            with self._tx():
                self._px("UPDATE origins SET finished_run = %s WHERE origin = ANY(%s)",
                         (run, origins))

    def fleet_done(self, worker: str, run: int, due: float) -> bool:
        """True when no other live worker is busy and no partition has work (one snapshot)."""
        query = (
            f"SELECT NOT EXISTS (SELECT 1 FROM workers w WHERE w.id <> %(me)s "
            f"  AND w.stopped IS NULL AND w.busy = 1 AND w.heartbeat > {NOW} - w.lease_seconds)"
            # an origin not partitioned yet may have work: the next poll partitions it
            f" AND NOT EXISTS (SELECT 1 FROM origins o WHERE o.configured = 1 AND o.part IS NULL)"
            f" AND NOT EXISTS (SELECT 1 FROM origins o LEFT JOIN leases l ON l.part = o.part "
            f"  WHERE o.configured = 1 AND (o.finished_run IS NULL OR o.finished_run <> %(run)s)"
            f"  AND " + _work(f" OR l.worker IS NULL OR l.expires < {NOW}") + ")"
        )
        row = self._px(query, {"me": worker, "run": run, "due": due}).fetchone()
        return bool(row[0])

    def fleet_stats(self) -> dict[str, Any]:
        """Workers, their leases, and their rates (overall and over the last minute)."""
        now = float(self._px(f"SELECT {NOW}").fetchone()[0])
        workers = []
        for wid, host, pid, started, beat, busy, stopped, lease_s in self._px(
            "SELECT id, host, pid, started, heartbeat, busy, stopped, lease_seconds "
            "FROM workers ORDER BY started"
        ).fetchall():
            parts = [int(r[0]) for r in self._px(
                "SELECT part FROM leases WHERE worker = %s AND expires > %s ORDER BY part",
                (wid, now),
            )]
            total, recent, first, last = self._px(
                "SELECT COUNT(*), COUNT(*) FILTER (WHERE started > %s), MIN(started), "
                "MAX(started) FROM crawl_log WHERE worker = %s",
                (now - 60, wid),
            ).fetchone()
            alive = stopped is None and beat > now - lease_s
            span = max(1e-9, ((last or 0) - (first or 0))) if total and total > 1 else None
            workers.append({
                "worker": wid, "host": host, "pid": pid,
                "state": ("busy" if busy else "idle") if alive else (
                    "stopped" if stopped is not None else "lost"),
                "started": started, "heartbeat_age": round(now - beat, 1),
                "leases": len(parts), "partitions": parts,
                "actions": int(total), "actions_last_minute": int(recent),
                "rate": round(total / span, 2) if span else 0.0,
                "rate_last_minute": round(recent / 60.0, 2),
            })
        free = int(self._px(
            "SELECT COUNT(*) FROM leases WHERE worker IS NULL OR expires <= %s", (now,)
        ).fetchone()[0])
        total_parts = int(self._px("SELECT COUNT(*) FROM leases").fetchone()[0])
        return {"partitions": total_parts, "free_partitions": free, "workers": workers}

    def stats(self) -> dict[str, Any]:
        data = super().stats()
        data["fleet"] = self.fleet_stats()
        return data


class _Lookup:
    """One page's look-ups on PostgreSQL: its statement (sql None: nothing to ask), then the
    answer made of its rows (PostgresBatches.page_lookups)."""

    def __init__(self, store: PostgresBatches, content_hash: str | None,
                 signature: bytes | None, url: str, min_similarity: float,
                 links: list[str] | None, score: float, own: int | None = None) -> None:
        self.store, self.signature, self.url = store, signature, url
        self.min_similarity, self.links, self.score = min_similarity, links, score
        parts: list[str] = []
        params: list[Any] = []
        if content_hash is not None:
            parts.append("(SELECT 'h', url, NULL::text, NULL::float8 FROM candidates WHERE "
                         f"{store._q(SAME_HASH)} LIMIT 1)")
            params += [content_hash, url]
        keys = [] if signature is None else dedup.band_keys(signature)
        if keys:
            parts.append(f"({ANY_KEY})")
            params.append(_array(map(str, keys)))
        if own is not None and signature is not None:  # its last version's (a recrawl)
            parts.append(f"({OWN_SIGNATURE})")
            params += [own, store._url_part(url)]
        self.changing: list[str] = []
        self.unknown: list[str] = []
        if links is not None:
            self.changing, self.unknown = store.seen.changing(links, score)
            if self.unknown:
                parts.append(f"({STATES})")
                params.append(_array(str(store._url_part(url)) for url in self.unknown))
                params.append(_array(_quoted(url) for url in self.unknown))
        self.sql = " UNION ALL ".join(parts) if parts else None
        self.params = params

    def answer(self, rows: list[Any]) -> tuple[str | None, tuple[str, float] | None,
                                               list[str] | None, float | None]:
        """The look-ups' answer from the statement's rows."""
        store, signature = self.store, self.signature
        original = next((str(r[1]) for r in rows if r[0] == "h"), None)
        last = next((bytes.fromhex(r[1]) for r in rows if r[0] == "o"), None)
        itself = None if last is None or signature is None else own_similarity(signature, last)
        similar = None
        if original is None and signature is not None:
            if any(r[0] == "k" for r in rows):
                similar = store.find_similar(signature, self.url, self.min_similarity)
            else:  # recorded without counting its buckets again
                store._no_key_shared(signature)
        if self.links is None:
            return original, similar, None, itself
        changing = self.changing
        if self.unknown:
            found: dict[str, LinkState] = {}
            store._remember([r[1:] for r in rows if r[0] == "s"], found)
            store._absent(self.unknown, found)
            changing = store.seen.changing(changing, self.score)[0]
        return original, similar, changing, itself


class _Rows(list[tuple[Any, ...]]):
    """A read's rows, as the callers of a psycopg cursor read them."""

    def fetchone(self) -> tuple[Any, ...] | None:
        return self[0] if self else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self


def _array(items: Iterable[str]) -> str:
    """An array literal of these elements: the server parses it (`%s::bigint[]`, `text[]`);
    psycopg's list dumper took 15 % of the database thread's time on the look-ups' arrays."""
    return "{" + ",".join(items) + "}"


def _quoted(text: str) -> str:
    """An array literal's element: any text, quoted."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _backend(conn: psycopg.Connection[Any], path: str, retry_seconds: float) -> str:
    """The server process of a new connection, its first statement. A session pooler with no
    server connection to spare keeps it waiting: one warning line says so after POOL_WAIT
    seconds, and after retry_seconds more the connection is given up (one line)."""
    conn.pgconn.send_query(b"SELECT pg_backend_pid()")
    pid = _answer(conn.pgconn, POOL_WAIT)
    if pid is None:
        log.warning("%s has given no server connection in %.0fs: waiting up to %.0fs more "
                    "(a pooler's pool is full? each courtly worker keeps two in session mode)",
                    path, POOL_WAIT, retry_seconds)
        pid = _answer(conn.pgconn, retry_seconds)
    if pid is None:
        conn.close()
        raise StoreError(
            f"cannot connect to {path}: no server connection in {POOL_WAIT + retry_seconds:.0f}s"
            " (a pooler's pool is full? each courtly worker keeps two in session mode: "
            "docs/distributed.md)")
    return pid


def _hands_sessions_on(mine: str, connect: Callable[[], psycopg.Connection[Any]]) -> bool:
    """Whether another session gets the server connection `mine` (a backend's process id) was:
    a pooler that hands sessions on between transactions (PgBouncer's transaction or statement
    mode gives the one just released, LIFO). Two sessions of a server are two backends while
    both are open. A pooler with no server connection to spare keeps the second waiting: after
    a second, this says False (a session pooler, or a full one; it cannot tell)."""
    other = connect()
    try:
        other.pgconn.send_query(b"SELECT pg_backend_pid()")
        return _answer(other.pgconn, 1.0) == mine
    finally:
        other.close()


def _answer(pgconn: Any, seconds: float) -> str | None:
    """The one value the statement sent on this connection answers (asked by hand, libpq: to
    wait no more than `seconds`), or None when it has not answered by then (still waiting)."""
    deadline = time.monotonic() + seconds
    while True:
        pgconn.consume_input()
        if not pgconn.is_busy():
            break
        left = deadline - time.monotonic()
        if left <= 0 or not wait_for(pgconn.socket, select.POLLIN, left):
            return None
    result = pgconn.get_result()
    while pgconn.get_result() is not None:  # the connection is psycopg's again
        pass
    if result is None or result.status != psycopg.pq.ExecStatus.TUPLES_OK:  # a pooler's error
        why = b"no answer" if result is None else result.error_message
        raise psycopg.OperationalError(why.decode(errors="replace"))
    value = result.get_value(0, 0) if result.ntuples == 1 else None
    return None if value is None else value.decode()


def _unknown_part(origin: str) -> int:
    """The partition of rows written while the crawl has none."""
    return -1


def _leading(row: tuple[Any, ...]) -> Any:
    """An upsert's row's key, to sort by: its first value, with the second after a number (a
    partition, a candidate or a band key: the rest of the key is next)."""
    return row[:2] if type(row[0]) is int else row[0]


def _lost(exc: psycopg.Error, where: str) -> ConnectionLost:
    """A connection that broke during a transaction: the caller sends it again."""
    return ConnectionLost(f"lost the connection to {where}: {one_line(exc)}")


def _error(exc: psycopg.Error, where: str) -> StoreError:
    """The StoreError of a failed statement, saying what it means for the user."""
    text = one_line(exc)
    state = exc.sqlstate or ""
    if state == "53100" or "No space left" in text or "disk full" in text.lower():
        return StoreError(f"disk full on {where}: {text}")
    # OperationalError also covers the server's limits (54xxx, e.g. an index row too large):
    # only connection failures (class 08, admin shutdown 57P, or no SQLSTATE) are a lost link
    if isinstance(exc, psycopg.OperationalError) and (not state or state.startswith(("08", "57P"))):
        return ConnectionLost(f"lost the connection to {where}: {text}")
    return StoreError(f"database error on {where}: {text}")
