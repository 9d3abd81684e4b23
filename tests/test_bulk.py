"""BulkSender: many statements in one libpq pipeline, on the real PostgreSQL server."""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from courtly.store.bulk import BulkSender
from courtly.store.postgres import conninfo_and_schema
from tests.pgserver import PgUrl

pytestmark = pytest.mark.postgres

INSERT = "INSERT INTO t (id, name, score, body, tags) VALUES (%s, %s, %s, %s, %s)"


@pytest.fixture
def conn(pg_url: PgUrl) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection in the test's schema, with a table t."""
    conninfo, schema = conninfo_and_schema(pg_url)
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        c.execute(f"SET search_path TO {schema}")
        c.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, name TEXT, score DOUBLE PRECISION, "
                  "body BYTEA, tags TEXT[])")
        yield c


def table(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT id, name, score, body, tags FROM t ORDER BY id").fetchall()


def test_rows_of_several_statements_run_in_order_and_commit(conn: psycopg.Connection[Any]) -> None:
    """Each statement once per row, in order (the UPDATE sees the INSERTs before it), ending
    with the COMMIT; a column NULL in one row and set in another (two parameter types) works
    (such rows are not merged into one INSERT: test_postgres.py has rows that are)."""
    rows = [(1, "a", 0.5, b"\x00\xff", ["x", "y"]), (2, None, None, None, None),
            (3, "c%s", 1e300, b"", [])]
    sender = BulkSender()
    conn.execute("BEGIN")
    ran = sender.execute(conn, [(INSERT, rows),
                                ("UPDATE t SET name = name || '!' WHERE id = %s", [(1,), (3,)])],
                         b"COMMIT")
    assert ran == 5
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert table(conn) == [(1, "a!", 0.5, b"\x00\xff", ["x", "y"]),
                           (2, None, None, None, None), (3, "c%s!", 1e300, b"", [])]
    # a second batch on the same connection uses the statements prepared by the first
    conn.execute("BEGIN")
    assert sender.execute(conn, [(INSERT, [(4, "d", 0.0, b"d", ["d"])])], b"COMMIT") == 1
    assert len(table(conn)) == 4


def test_a_failing_row_stops_the_batch_and_is_the_error_raised(
        conn: psycopg.Connection[Any]) -> None:
    """A row the server refuses: its error is raised once every result is read; nothing of the
    batch is committed, the connection is usable, and the next batch prepares no name twice."""
    sender = BulkSender()
    conn.execute("BEGIN")
    sender.execute(conn, [(INSERT, [(1, "a", 1.0, b"a", ["a"])])], b"COMMIT")
    conn.execute("BEGIN")
    with pytest.raises(psycopg.errors.UniqueViolation):
        sender.execute(conn, [("UPDATE t SET score = %s WHERE id = %s", [(2.0, 1)]),
                              (INSERT, [(2, "b", 1.0, None, None), (1, "again", 1.0, None, None),
                                        (3, "c", 1.0, None, None)])], b"COMMIT")
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    conn.execute("ROLLBACK")
    assert table(conn) == [(1, "a", 1.0, b"a", ["a"])]
    conn.execute("BEGIN")
    assert sender.execute(conn, [("UPDATE t SET score = %s WHERE id = %s", [(3.0, 1)]),
                                 (INSERT, [(2, "b", 1.0, None, None)])], b"COMMIT") == 2
    assert [r[2] for r in table(conn)] == [3.0, 1.0]


def test_a_batch_larger_than_the_sockets_buffers_is_sent(conn: psycopg.Connection[Any]) -> None:
    """24 MB of rows out and as much in answers: reading while sending, neither side stalls
    (the server stops reading while its answers are not read)."""
    body = os.urandom(8192)
    rows = [(i, f"n{i}", float(i), body, None) for i in range(3000)]
    conn.execute("BEGIN")
    assert BulkSender().execute(conn, [(INSERT, rows)], b"COMMIT") == 93 + 2  # 32s, 16, 8
    assert conn.execute("SELECT count(*), sum(length(body)) FROM t").fetchone() == (
        3000, 3000 * 8192)
    answers: list[Any] = []
    echo = threading.Thread(target=lambda: answers.append(BulkSender().fetch(
        conn, [("SELECT %s::bytea", [body])] * 3000)), daemon=True)
    echo.start()
    echo.join(60)
    assert answers == [[[(body,)]] * 3000], "the pipeline stalled"


def test_queries_answer_in_order_with_their_rows(conn: psycopg.Connection[Any]) -> None:
    """fetch: each query's rows, in order, empty ones too; an error is raised."""
    conn.execute("INSERT INTO t (id, name, tags) VALUES (1, 'a', '{x}'), (2, 'b', NULL)")
    sender = BulkSender()
    found = sender.fetch(conn, [("SELECT id, name FROM t WHERE id = ANY(%s) ORDER BY id",
                                 [[1, 2]]),
                                ("SELECT id FROM t WHERE name = %s", ["none"]),
                                ("SELECT tags, %s::text FROM t WHERE id = %s", [None, 1])])
    assert found == [[(1, "a"), (2, "b")], [], [(["x"], None)]]
    with pytest.raises(psycopg.errors.DivisionByZero):
        sender.fetch(conn, [("SELECT 1 / %s", [0])])
    assert sender.fetch(conn, [("SELECT 1 / %s", [1])]) == [[(1,)]]


def test_a_connection_lost_mid_batch_is_a_broken_connection(
        pg_url: PgUrl, conn: psycopg.Connection[Any]) -> None:
    """The server ends the session: an OperationalError, and psycopg sees the connection
    broken (the store then reconnects)."""
    conninfo, _ = conninfo_and_schema(pg_url)
    with psycopg.connect(conninfo, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    with pytest.raises(psycopg.OperationalError):
        BulkSender().execute(conn, [(INSERT, [(1, "a", 1.0, None, None)])], b"COMMIT")
    assert conn.broken


def test_a_socket_past_1024_is_waited_on(pg_url: PgUrl) -> None:
    """A broad crawl holds over 1,024 descriptors: the connection's socket is waited on with
    poll(), which select() could not."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(1200, hard)), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1050)]
    try:
        conninfo, _ = conninfo_and_schema(pg_url)
        with psycopg.connect(conninfo, autocommit=True) as late:
            assert late.pgconn.socket > 1024
            rows = [(f"v{i}" * 2000,) for i in range(200)]  # more than one socket write
            assert BulkSender().fetch(late, [("SELECT length(%s)", r) for r in rows]) == [
                [(len(r[0]),)] for r in rows]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_statements_deallocated_by_psycopg_are_prepared_again(
        conn: psycopg.Connection[Any]) -> None:
    """psycopg sends DEALLOCATE ALL after a ROLLBACK: the next pipeline fails with the
    statement's name unknown, and the one after prepares it again."""
    sender = BulkSender()
    query = [("SELECT %s::int + 1", [1])]
    assert sender.fetch(conn, query) == [[(2,)]]
    conn.execute("DEALLOCATE ALL")
    with pytest.raises(psycopg.errors.InvalidSqlStatementName):
        sender.fetch(conn, query)
    assert sender.fetch(conn, query) == [[(2,)]]
    sender.forget()  # told beforehand (the store does at each ROLLBACK): no failure at all
    conn.execute("DEALLOCATE ALL")
    assert sender.fetch(conn, query) == [[(2,)]]


def test_a_value_no_adapter_takes_leaves_the_connection_usable(
        conn: psycopg.Connection[Any]) -> None:
    """A row that cannot be sent (a bug: a value psycopg cannot adapt) raises, nothing of the
    batch is committed, and the connection is out of pipeline mode and usable."""
    conn.execute("BEGIN")
    with pytest.raises(psycopg.ProgrammingError):
        BulkSender().execute(conn, [(INSERT, [(1, "a", 1.0, None, None),
                                              (2, object(), 1.0, None, None)])], b"COMMIT")
    assert conn.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF
    conn.execute("ROLLBACK")
    assert table(conn) == []
    assert conn.execute("SELECT 1").fetchone() == (1,)
