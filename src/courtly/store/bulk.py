"""Many rows' statements sent to PostgreSQL in one libpq pipeline, flushed once (the fleet's
write batches; docs/distributed.md).

Written by hand because psycopg's executemany flushes the socket and polls it after every row:
in the crawl process each poll hands the GIL to the event loop and waits to get it back, which
made the database thread the slowest part of a worker (bench/RESULTS.md). Here every row goes
into libpq's buffer, the buffer is sent once and the results are read once, with psycopg's
documented libpq wrapper (`psycopg.pq`) and adapters (`psycopg.adapt.Transformer`). An INSERT's
rows go as multi-row statements (`_merged_texts`), rows of the same parameter types together:
the server starts and ends one execution a chunk, not a row (PostgreSQL's CPU a page 2-9 %
less, the server a fleet shares; bench/RESULTS.md).
"""

from __future__ import annotations

import itertools
import re
import select
from collections.abc import Iterable, Sequence
from contextlib import suppress
from operator import itemgetter
from typing import Any

import psycopg
from psycopg import errors
from psycopg.adapt import PyFormat, Transformer
from psycopg.pq import ExecStatus

_PLACEHOLDER = re.compile(r"%(%|s)")
#: prepared statements' numbers: a name is never used twice in a process (a failed pipeline's
#: PREPARE may or may not have run; two senders may share a connection)
_NAMES = itertools.count(1)


class BulkSender:
    """Runs many statements on one connection in one pipeline, preparing each query once."""

    def __init__(self) -> None:
        self._names: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self._on: Any = None  # the libpq connection the names were prepared on
        self._queries: dict[str, bytes] = {}

    def execute(self, conn: psycopg.Connection[Any],
                statements: Iterable[tuple[str, list[tuple[Any, ...]]]], last: bytes,
                first: bytes | None = None) -> int:
        """Run `first` (a BEGIN), each statement (psycopg's %s placeholders) for each of its rows
        (an INSERT's rows merged: `_merged_texts`), then `last` (a COMMIT), in one pipeline;
        how many statements ran. After every result is read, raises the first error (a
        psycopg.Error: the rest of the pipeline did not run)."""
        return self._pipeline(conn, statements, last, want=False, first=first)[0]

    def fetch(self, conn: psycopg.Connection[Any],
              queries: list[tuple[str, Sequence[Any]]]) -> list[list[tuple[Any, ...]]]:
        """Each query's rows, the queries sent in one pipeline; raises the first error."""
        return self._pipeline(conn, ((sql, [params]) for sql, params in queries), None,
                              want=True)[1]

    def _pipeline(self, conn: psycopg.Connection[Any],
                  statements: Iterable[tuple[str, Sequence[Sequence[Any]]]], last: bytes | None,
                  want: bool, first: bytes | None = None,
                  ) -> tuple[int, list[list[tuple[Any, ...]]]]:
        """How many statements ran, and (if `want`) each one's rows."""
        pg = conn.pgconn
        if self._on is not pg:
            self._names, self._on = {}, pg
        tx = Transformer(conn)
        new: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        sent = 0
        synced = False
        pg.enter_pipeline_mode()
        try:
            if first is not None:
                pg.send_query_params(first, None)
            for sql, rows in statements:
                texts = _merged_texts(sql, rows)
                dumped = [(tx.dump_sequence(row, [PyFormat.AUTO] * len(row)),
                           tuple(tx.types or ()), tuple(tx.formats or ())) for row in rows]
                if texts is None:
                    for params, types, formats in dumped:
                        self._send(pg, new, self._query(sql), params, types, formats)
                    sent += len(dumped)
                    continue
                # rows of the same parameter types, one after another, in chunks: a statement
                # is prepared for each chunk size and types
                for (types, formats), run in itertools.groupby(dumped, itemgetter(1, 2)):
                    same = list(run)
                    i = 0
                    while i < len(same):
                        size = next(c for c in _CHUNKS if c <= len(same) - i)
                        params = [v for row in same[i:i + size] for v in row[0]]
                        self._send(pg, new, self._query(texts[size]), params, types * size,
                                   formats * size)
                        sent += 1
                        i += size
            if last is not None:
                pg.send_query_params(last, None)
            pg.pipeline_sync()
            synced = True
            results = _read_to_sync(pg, conn.info.encoding, tx if want else None)
        except errors.InvalidSqlStatementName:  # gone: psycopg sends DEALLOCATE ALL after a
            self.forget()  # ROLLBACK; prepared again next time
            raise
        finally:
            if pg.status == psycopg.pq.ConnStatus.OK:
                if not synced:  # stopped while queueing (a value no adapter takes: a bug)
                    with suppress(psycopg.Error):  # what was queued ends, and the connection
                        pg.pipeline_sync()  # is usable again
                        _read_to_sync(pg, conn.info.encoding, None)
                pg.exit_pipeline_mode()
        self._names.update(new)  # prepared: the pipeline ran to its end
        return sent, results

    def _send(self, pg: Any, new: dict[tuple[bytes, tuple[int, ...]], bytes], query: bytes,
              params: Sequence[Any], types: tuple[int, ...], formats: tuple[Any, ...]) -> None:
        """Queue one statement, prepared first if this connection has not prepared it."""
        key = (query, types)
        name = self._names.get(key) or new.get(key)
        if name is None:
            name = new[key] = b"courtly_bulk_%d" % next(_NAMES)
            pg.send_prepare(name, query, param_types=types)
        pg.send_query_prepared(name, params, param_formats=formats)

    def forget(self) -> None:
        """The connection's prepared statements are gone (or about to go): prepare again."""
        self._names = {}

    def _query(self, sql: str) -> bytes:
        """psycopg's placeholders to libpq's ($1, $2 …), as bytes."""
        query = self._queries.get(sql)
        if query is None:
            count = 0

            def number(found: re.Match[str]) -> str:
                nonlocal count
                if found.group(1) == "%":
                    return "%"
                count += 1
                return f"${count}"

            query = self._queries[sql] = _PLACEHOLDER.sub(number, sql).encode()
        return query


_INSERT = re.compile(r"(INSERT INTO \S+ \(([^)]*)\) VALUES )((?:\((?:%s, )*%s\)(?:, )?)+)"
                     r"( ON CONFLICT.*)?$", re.S)
_TARGET = re.compile(r" ON CONFLICT \(([^)]*)\) DO UPDATE")
#: rows a merged statement holds at most; a batch's rows go in chunks of these sizes, so that
#: a statement is prepared once for each size
_CHUNKS = (32, 16, 8, 4, 2, 1)
_MERGEABLE: dict[str, tuple[dict[int, str], tuple[int, ...] | None] | tuple[()]] = {}


def _merged_texts(sql: str, rows: Sequence[Sequence[Any]]) -> dict[int, str] | None:
    """An INSERT's statement for each chunk size, if its rows may go as multi-row statements:
    not a row at a time, nor an upsert whose rows touch one key twice (one statement may not
    update a row twice: the later row must win, as it does a row at a time)."""
    if len(rows) < 2:
        return None
    shape = _MERGEABLE.get(sql)
    if shape is None:
        shape = _MERGEABLE[sql] = _shape(sql)
    if not shape:
        return None
    texts, key = shape
    if key is not None and len({tuple(row[i] for i in key) for row in rows}) < len(rows):
        return None
    return texts


def _shape(sql: str) -> tuple[dict[int, str], tuple[int, ...] | None] | tuple[()]:
    """The statement for each chunk size, and the positions of an upsert's key in a row; ()
    if the statement is not an INSERT of rows that can be merged."""
    found = _INSERT.fullmatch(sql)
    if found is None:
        return ()
    head, columns, values, tail = found.group(1, 2, 3, 4)
    tail = tail or ""
    names = [c.strip() for c in columns.split(",")]
    key: tuple[int, ...] | None = None
    target = _TARGET.match(tail)
    if target is not None:
        wanted = [c.strip() for c in target.group(1).split(",")]
        if values.count("(") != 1 or not set(wanted) <= set(names):
            return ()
        key = tuple(names.index(c) for c in wanted)
    elif " DO UPDATE" in tail:
        return ()
    return {size: head + ", ".join([values] * size) + tail for size in _CHUNKS}, key


def _read_to_sync(pg: Any, encoding: str, tx: Any) -> list[list[tuple[Any, ...]]]:
    """Send what libpq holds and read every result up to the pipeline's sync: the rows of each
    query's result (with a transformer `tx`); raise the first error. The socket is waited on
    with the GIL released (poll), reading while sending so that neither side's buffer fills
    up and stalls the other."""
    socket = pg.socket
    while pg.flush() == 1:
        if wait_for(socket, select.POLLIN | select.POLLOUT) & select.POLLIN:
            pg.consume_input()
    error: psycopg.Error | None = None
    rows: list[list[tuple[Any, ...]]] = []
    while True:
        while pg.is_busy():
            wait_for(socket, select.POLLIN)
            pg.consume_input()
        result = pg.get_result()
        if result is None:  # the end of one statement's results
            continue
        status = result.status
        if status == ExecStatus.PIPELINE_SYNC:
            break
        if status == ExecStatus.FATAL_ERROR and error is None:
            error = errors.error_from_result(result, encoding=encoding)
        elif status == ExecStatus.TUPLES_OK and tx is not None:  # a PREPARE's is COMMAND_OK
            tx.set_pgresult(result)
            rows.append(tx.load_rows(0, result.ntuples, tuple))
    if error is not None:
        raise error
    return rows


def wait_for(socket: int, events: int, seconds: float | None = None) -> int:
    """The events that happened on the socket, waiting for one of `events` at most `seconds`
    (0: none happened in time); poll, not select: a crawl's descriptors pass 1024."""
    waiting = select.poll()
    waiting.register(socket, events | select.POLLERR | select.POLLHUP)
    return sum(event for _, event in waiting.poll(None if seconds is None else seconds * 1000))
