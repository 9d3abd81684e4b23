"""The PostgreSQL backend: portable SQL on psycopg, partitions, and losing the server.

The crawl-loop suites (test_crawl.py, test_resume.py) also run on PostgreSQL through the `db`
fixture; these tests cover what only this backend has.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import resource
import signal
import socket
import string
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
import zstandard

from courtly import dedup
from courtly.analysis import compress
from courtly.model import CrawlAction, ExitCode, Link, LinkState
from courtly.site import Page, html
from courtly.store import StoreError, open_store
from courtly.store.base import Write
from courtly.store.bulk import BulkSender
from courtly.store.database import Database, StrategyStore
from courtly.store.postgres import (
    ANY_KEY,
    STATES,
    PostgresStore,
    conninfo_and_schema,
    database_exists,
    shown_url,
)
from courtly.store.schema import MIGRATIONS
from courtly.store.thread import BUSY
from courtly.urls import partition_key, partition_of
from tests.conftest import courtly, courtly_process, fetched_paths, rows
from tests.pgserver import PgUrl

pytestmark = pytest.mark.postgres


def test_store_speaks_portable_sql_on_postgres(pg_url: PgUrl) -> None:
    assert not database_exists(pg_url)
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore) and database_exists(pg_url)
    try:
        origin = "http://a.example"
        store.add_origins([origin])
        assert store.add_links([Link(f"{origin}/100%", origin, 0, 1.0),
                                Link(f"{origin}/?q=1", origin, 0, 2.0)]) == 2
        assert store.add_links([Link(f"{origin}/100%", origin, 0, 0.5)]) == 0  # known: no-op
        run = store.begin_run()
        todo = store.take_todo(origin, run, 10, time.time())
        assert [c.url for c in todo] == [f"{origin}/?q=1", f"{origin}/100%"]  # best score first
        body = b"\x00\xff<html>binary-safe</html>"
        action = CrawlAction(todo[0], origin, ExitCode.OK, time.time(), http_status=200,
                             content_hash="h1", content=compress(body))
        store.record(action, run)
        stored = rows(pg_url, "SELECT body FROM content")[0]["body"]
        assert zstandard.ZstdDecompressor().decompress(stored) == body
        assert store.find_hash("h1", "other") == todo[0].url
        assert store.stats()["by_state"] == {"CRAWLED": 1, "NOT_CRAWLED": 1}
        # taking reads only: what was recorded is not taken again, the rest is
        assert [c.url for c in store.take_todo(origin, run, 10, time.time())] == [todo[1].url]
    finally:
        store.close()
    again = PostgresStore(pg_url)  # migrations are not run twice
    again.close()
    version = rows(pg_url, "SELECT version FROM schema_version")
    assert version == [{"version": len(MIGRATIONS)}]


def test_database_url_mistakes_are_one_line(pg_url: PgUrl) -> None:
    with pytest.raises(StoreError, match="invalid schema name"):
        conninfo_and_schema("postgresql://x/test?schema=a;drop")
    closed = "postgresql://postgres@127.0.0.1:1/test"
    run = courtly("stats", "--db", closed)
    assert run.status == 1 and "cannot connect to postgresql://127.0.0.1:1/test" in run.err
    assert len(run.err.strip().splitlines()) == 1
    missing = courtly("stats", "--db", pg_url)
    assert missing.status == 2 and "no crawl database" in missing.err
    assert not pg_url.exists()


def test_no_message_shows_the_database_password(pg_url: PgUrl, serve: Any,
                                                tmp_path: Path) -> None:
    """`add-seeds` said `… seeds in postgresql://postgres:s3cret@…` and `stats`, `export`,
    `report`, `serve` and `crawl` of a schema not made yet `no crawl database at
    postgresql://postgres:s3cret@…`: the --db value as given, password and all."""
    user = urlsplit(pg_url)
    if user.username is None or user.password is not None:
        pytest.skip("the test server's URL has no user, or a password of its own")
    secret = pg_url.replace(f"://{user.username}@", f"://{user.username}:s3cret@", 1)
    out = ("--out", str(tmp_path / "report.html"))
    for command in (("stats",), ("export",), ("report", *out), ("serve",), ("crawl",)):
        run = courtly(*command, "--db", secret)
        assert run.status == 2 and "no crawl database at postgresql://" in run.err, run.err
        assert "s3cret" not in run.err, run.err
    site = serve({"a": {"/": Page(html("home", []))}})
    run = courtly("add-seeds", "--db", secret, site.url("a", "/"))
    assert run.status == 0 and "1 new crawl candidates" in run.out
    assert "s3cret" not in run.out + run.err, run.out
    # a password with an unescaped '/' (base64) is not the user part libpq reads: still hidden
    assert shown_url("postgresql://crawler:pa/ss@127.0.0.1:5432/crawl?schema=x") == (
        "postgresql://127.0.0.1:5432/crawl?schema=x")


def test_partitions_hash_registered_domains() -> None:
    assert partition_key("https://www.example.co.uk") == "example.co.uk"
    assert partition_of("https://www.example.co.uk", 64) == partition_of(
        "http://shop.example.co.uk:8080", 64)
    # IP literals and single-label hosts: one partition key per origin
    assert partition_key("http://127.0.0.1:8001") == "http://127.0.0.1:8001"
    assert partition_key("http://localhost:80") == "http://localhost:80"
    # stable across processes and versions (xxh64, not Python's salted hash())
    assert partition_of("https://example.org", 64) == 53  # pinned
    spread = Counter(partition_of(f"https://site{i}.com", 16) for i in range(1600))
    assert len(spread) == 16 and min(spread.values()) > 60


def test_a_server_limit_is_a_database_error_not_a_lost_connection(pg_url: PgUrl) -> None:
    """An index row over PostgreSQL's limit (a URL of KBs of random text) is an
    OperationalError too; the message gives the reason, and the store goes on working."""
    store = PostgresStore(pg_url)
    try:
        store.add_origins(["http://a.example"], seed=True)
        rng = random.Random(3)
        huge = "http://a.example/" + "".join(rng.choices(string.ascii_letters, k=8000))
        with pytest.raises(StoreError, match=r"database error on .*index row size") as caught:
            store.add_links([Link(huge, "http://a.example", 1, 0.5)])
        assert "lost the connection" not in str(caught.value)
        store.add_links([Link("http://a.example/ok", "http://a.example", 1, 0.5)])
        assert [c.url for c in store.take_todo("http://a.example", 1, 5, time.time())] == [
            "http://a.example/ok"
        ]
    finally:
        store.close()


def test_the_near_duplicate_probe_reads_the_index_before_any_statistics(pg_url: PgUrl) -> None:
    """A new crawl's band keys have no statistics yet: the probe of a page's keys must still
    use the index, not read the whole table (once a page, growing with the crawl)."""
    PostgresStore(pg_url).close()
    conninfo, schema = conninfo_and_schema(pg_url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        conn.execute("INSERT INTO near_dup_keys (key, candidate, part) "
                     "SELECT g * 7919, g, g % 64 FROM generate_series(1, 30000) AS g")
        plan = conn.execute("EXPLAIN " + ANY_KEY, ([1, 2, 3, 4, 5, 6, 7, 8],)).fetchall()
    shown = "\n".join(r[0] for r in plan)
    assert "Seq Scan on near_dup_keys" not in shown and "near_dup_keys_6_pkey" in shown, shown
    assert "near_dup_recent" not in shown, shown  # nothing staged there (migration 15)


def test_a_pages_link_states_are_read_by_index_with_a_plan_made_on_an_empty_table(
        pg_url: PgUrl) -> None:
    """The look-up of a page's unknown links is a prepared statement: its plan, made while the
    crawl's candidates were few, is kept as the table grows (with no statistics it is never
    made again). It must probe the URL index (`url = ANY(urls)` was a scan of the table: 1-3 ms
    a page at 22,000 URLs, growing)."""
    PostgresStore(pg_url).close()
    conninfo, schema = conninfo_and_schema(pg_url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        conn.execute("SET plan_cache_mode = force_generic_plan")  # the plan a prepared one keeps
        prepared = conn.pgconn.exec_(  # the simple protocol: $1, $2 are PREPARE's parameters
            ("PREPARE states(integer[], text[]) AS "
             + STATES.replace("%s", "$1", 1).replace("%s", "$2")).encode())
        assert prepared.status == psycopg.pq.ExecStatus.COMMAND_OK, prepared.error_message
        assert conn.execute(  # planned
            "EXECUTE states('{5}', '{http://a.example/1}')").fetchall() == []
        conn.execute("INSERT INTO candidates (part, url, origin) SELECT 5, "
                     "'http://a.example/' || g, 'http://a.example' "
                     "FROM generate_series(1, 30000) AS g")
        plan = conn.execute("EXPLAIN EXECUTE states('{5}', '{http://a.example/7}')").fetchall()
        found = conn.execute("EXECUTE states('{5,5}', "
                             "'{http://a.example/7,http://a.example/none}')").fetchall()
    shown = "\n".join(r[0] for r in plan)
    assert "Seq Scan on candidates" not in shown and "candidates_url_key" in shown, shown
    assert [(kind, url) for kind, url, _, _ in found] == [("s", "http://a.example/7")]


def test_a_redirect_chain_is_walked_by_index_with_a_plan_made_on_an_empty_table(
        pg_url: PgUrl) -> None:
    """redirect_chain's statement, prepared while the crawl had few redirects, keeps probing
    the target index once it has many (with `LIMIT 1` the plan kept was a scan)."""
    store = PostgresStore(pg_url)
    conninfo, schema = conninfo_and_schema(pg_url)
    queries: list[str] = []
    read = store._read

    def traced(sql: str, params: Any = ()) -> Any:
        queries.append(sql)
        return read(sql, params)

    store._read = traced  # type: ignore[method-assign]
    assert store.redirect_chain("http://a.example/x", 5) == 0
    store.close()
    statement = next(q for q in queries if "FROM redirects" in q)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        prepared = conn.pgconn.exec_(
            ("PREPARE chain(text) AS " + statement.replace("?", "$1")).encode())
        assert prepared.status == psycopg.pq.ExecStatus.COMMAND_OK, prepared.error_message
        assert conn.execute("EXECUTE chain('http://a.example/x')").fetchall() == []  # planned
        conn.execute("INSERT INTO redirects (part, url, target, status, seen) SELECT 0, "
                     "'http://a.example/r' || g, 'http://a.example/t' || g, 301, 0 "
                     "FROM generate_series(1, 30000) AS g")
        plan = conn.execute("EXPLAIN EXECUTE chain('http://a.example/t7')").fetchall()
    shown = "\n".join(r[0] for r in plan)
    assert "Seq Scan on redirects" not in shown and "redirects_target" in shown, shown


def test_a_batch_that_raises_leaves_no_transaction_open(pg_url: PgUrl,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A write batch stopped by an exception that is not the database's (a bug) rolls back:
    no transaction stays open holding its rows' locks, and the next batch is written."""
    origin = "http://a.example"
    store = PostgresStore(pg_url)
    conninfo, schema = conninfo_and_schema(pg_url)
    try:
        store.add_origins([origin])
        write_rows = store._write_rows

        def failing(w: Write) -> None:
            write_rows(w)
            raise RuntimeError("a bug while writing")

        monkeypatch.setattr(store, "_write_rows", failing)
        with pytest.raises(RuntimeError):
            store.write_batch([Write(links=[Link(f"{origin}/a", origin, 1, 0.5)])])
        assert store._live().info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        monkeypatch.undo()
        with psycopg.connect(conninfo) as other:  # nothing of it is locked (ended at exit)
            other.execute(f"SET search_path TO {schema}")
            other.execute("SET lock_timeout = '2s'")
            other.execute("LOCK TABLE candidates IN EXCLUSIVE MODE")
        assert store.write_batch([Write(links=[Link(f"{origin}/b", origin, 1, 0.5)])]) == []
        assert {r["url"] for r in rows(pg_url, "SELECT url FROM candidates")} == {f"{origin}/b"}
    finally:
        store.close()


def test_a_batch_after_psycopg_deallocated_its_statements_is_sent_again(pg_url: PgUrl) -> None:
    """A ROLLBACK makes psycopg deallocate every prepared statement of the connection, the
    write batches' too (a frozen worker's refused batch did, and its next batch failed): the
    batch that finds its statements gone is sent again."""
    origin = "http://a.example"
    store = PostgresStore(pg_url)
    try:
        store.add_origins([origin])
        assert store.write_batch([Write(links=[Link(f"{origin}/a", origin, 1, 0.5)])]) == []
        store._live().execute("DEALLOCATE ALL")
        assert store.write_batch([Write(links=[Link(f"{origin}/b", origin, 1, 0.5)])]) == []
        assert {r["url"] for r in rows(pg_url, "SELECT url FROM candidates")} == {
            f"{origin}/a", f"{origin}/b"}
    finally:
        store.close()


def test_two_batches_upsert_shared_links_in_one_order(pg_url: PgUrl,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Two workers' batches that link to the same URLs lock them in the same order (the URLs'),
    whatever order the pages listed them in: neither waits for a deadlock to be detected."""
    origin = "http://a.example"
    first, second = PostgresStore(pg_url), PostgresStore(pg_url)
    conninfo, schema = conninfo_and_schema(pg_url)
    links = {u: Link(f"{origin}/{u}", origin, 1, 0.5) for u in "amz"}
    try:
        first.add_origins([origin])
        with psycopg.connect(conninfo) as holder:  # holds "m" until it commits
            holder.execute(f"SET search_path TO {schema}")
            holder.execute(  # the crawl has no partitions yet: its rows' part is -1
                "INSERT INTO candidates (part, url, origin, depth, score) VALUES (-1, %s, %s, 1, "
                "0.5)", (links["m"].url, origin))
            # the first batch locks "a", then waits for "m"; the second, listing "z" before
            # "a", would lock "z" and wait for "a": once "m" is free the first would wait for "z"
            a = threading.Thread(target=first.write_batch,
                                 args=([Write(links=[links["a"], links["m"], links["z"]])],))
            b = threading.Thread(target=second.write_batch,
                                 args=([Write(links=[links["z"], links["a"]])],))
            with caplog.at_level("INFO", logger="courtly"):
                a.start()
                time.sleep(0.5)
                b.start()
                time.sleep(0.5)
                holder.commit()
                a.join(10)
                b.join(10)
        assert "sent again" not in caplog.text
        assert {r["url"] for r in rows(pg_url, "SELECT url FROM candidates")} == {
            lk.url for lk in links.values()}
    finally:
        first.close()
        second.close()


def test_a_strategys_states_of_a_pages_links_need_no_wait(pg_url: PgUrl) -> None:
    """The states of a page's links are read with its look-ups: a strategy asking for them
    then is answered on the event loop, not by the database thread (here closed: a wait for
    it would fail)."""
    origin = "http://a.example"
    store = PostgresStore(pg_url)
    try:
        store.add_origins([origin])
        store.add_links([Link(f"{origin}/known", origin, 1, 0.5)])
        db = Database(store)
        links = [f"{origin}/known", f"{origin}/new"]

        async def look_up() -> None:
            await db.page_lookups(None, None, f"{origin}/", 0.8, links, 0.5)

        asyncio.run(look_up())
        db.close()
        assert StrategyStore(db).states(links) == {f"{origin}/known": LinkState.NOT_CRAWLED}
        with pytest.raises(StoreError, match="closed"):  # a URL not looked up waits
            StrategyStore(db).states([f"{origin}/other"])
    finally:
        store.close()


def test_a_dropped_connection_is_reconnected(pg_url: PgUrl) -> None:
    store = PostgresStore(pg_url)
    try:
        store.add_origins(["http://a.example"])
        pid = store._px("SELECT pg_backend_pid()").fetchone()[0]
        with psycopg.connect(conninfo_and_schema(pg_url)[0], autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        time.sleep(0.1)
        assert store.configured_origins() == ["http://a.example"]  # a read, retried
        store.add_origins(["http://b.example"])  # a transaction, retried at BEGIN
        assert len(store.configured_origins()) == 2
        # a server that stays away: retried with backoff, then one clear line
        store.retry_seconds = 1.0
        store._conninfo = "postgresql://postgres@127.0.0.1:1/test"
        pid = store._px("SELECT pg_backend_pid()").fetchone()[0]
        with psycopg.connect(conninfo_and_schema(pg_url)[0], autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"lost the connection to .*retried for 1s"):
            store.configured_origins()
        assert time.monotonic() - started >= 0.5
    finally:
        store.close()


class Proxy:
    """A TCP proxy to PostgreSQL that can be cut (connections reset, new ones refused)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._conns: list[socket.socket] = []
        self._server: socket.socket | None = None

    def start(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def cut(self) -> None:
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._conns.clear()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@pytest.fixture
def proxied(pg_url: PgUrl) -> Iterator[tuple[Proxy, str]]:
    parts = urlsplit(pg_url)
    proxy = Proxy((parts.hostname or "127.0.0.1", parts.port or 5432))
    proxy.start()
    netloc = f"{parts.username}@127.0.0.1:{proxy.port}" if parts.username else \
        f"127.0.0.1:{proxy.port}"
    yield proxy, parts._replace(netloc=netloc).geturl()
    proxy.cut()


def test_database_restart_is_survived_and_an_outage_stops_cleanly(serve, proxied,
                                                                  tmp_path) -> None:
    proxy, url = proxied
    n = 40
    pages = {"/": Page(html("home", [f"/p{i}" for i in range(n)]))}
    pages |= {f"/p{i}": Page(html(f"page {i} " + "x " * i, [], body=f"{i} " * i), delay=0.01)
              for i in range(n)}
    site = serve({"a": pages})
    toml = tmp_path / "crawl.toml"
    toml.write_text("[fleet]\nreconnect_seconds = 2\nlease_seconds = 3\n")
    assert courtly("add-seeds", site.url("a"), "--db", url).status == 0
    proc = courtly_process("worker", "--db", url, "--min-delay", "0.1", "--progress", "off",
                           "--config", toml)

    def crawled() -> int:
        return len(rows(url, "SELECT id FROM crawl_log"))

    deadline = time.monotonic() + 20
    while crawled() < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    proxy.cut()  # a restart: every connection drops, the server is back within the retry window
    time.sleep(0.8)
    proxy.start()
    while crawled() < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1]
    proxy.cut()  # an outage longer than the retry window
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    assert "lost the connection to postgresql://127.0.0.1" in err and "retried for 2s" in err
    proxy.start()
    again = courtly("worker", "--db", url, "--min-delay", "0.1", "--progress", "off")
    assert again.status == 0, again.err
    counts = Counter(r["url"] for r in rows(url, "SELECT url FROM crawl_log"))
    assert set(counts) == {site.url("a", p) for p in pages}, "a URL was lost"
    assert sum(c - 1 for c in counts.values()) <= 2  # only requests in flight at a cut
    assert {r["state"] for r in rows(url, "SELECT state FROM candidates")} == {"CRAWLED"}
    assert len(fetched_paths(site, "a")) <= n + 1 + 2


def worker_cut_off(serve: Any, proxied: Any, tmp_path: Path,
                   reconnect: int) -> subprocess.Popen[str]:
    """A worker crawling one origin whose database (through the proxy) was just cut off."""
    proxy, url = proxied
    pages = {"/": Page(html("home", [f"/p{i}" for i in range(30)]))}
    pages |= {f"/p{i}": Page(html(f"page {i}", []), delay=0.01) for i in range(30)}
    site = serve({"a": pages})
    toml = tmp_path / "crawl.toml"
    toml.write_text(f"[fleet]\nreconnect_seconds = {reconnect}\n")
    assert courtly("add-seeds", site.url("a"), "--db", url).status == 0
    proc = courtly_process("worker", "--db", url, "--min-delay", "0.2", "--progress", "off",
                           "--config", toml)
    deadline = time.monotonic() + 20
    while len(rows(url, "SELECT id FROM crawl_log")) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    proxy.cut()
    return proc


def test_an_outage_stops_a_worker_after_reconnect_seconds_not_twice(serve, proxied,
                                                                      tmp_path) -> None:
    """With `reconnect_seconds = 6` a worker whose database went away exited 12 s later:
    having given up on the crawl's connection, it retried giving its leases back for another
    6 s. It now tries that once."""
    proc = worker_cut_off(serve, proxied, tmp_path, 6)
    cut = time.monotonic()
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - cut
    assert proc.returncode == 1 and "retried for 6s" in err, err
    assert "could not give the leases back" in err, err
    # 6 s of retries, the in-flight turns' 2 s of grace, one try to give the leases back
    assert took < 9, (took, err)  # 12 s when the leases were retried as long again


def test_a_second_signal_stops_a_worker_waiting_for_its_database(serve, proxied,
                                                                 tmp_path) -> None:
    """A worker whose database went away ignored Ctrl-C and SIGTERM until reconnect_seconds
    ran out (a minute by default). The first signal still waits for the database, to write what
    was crawled; a second gives up at once."""
    proc = worker_cut_off(serve, proxied, tmp_path, 60)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    time.sleep(3.0)  # past the in-flight requests' grace: waiting for the database now
    assert proc.poll() is None, "the first signal did not wait for the database"
    proc.send_signal(signal.SIGINT)
    second = time.monotonic()
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - second
    assert proc.returncode == 1 and "gave up on a second signal" in err, err
    assert "Traceback" not in err, err
    assert took < 5, (took, err)  # it waited out the 60 s before


def test_two_workers_wait_out_a_ten_second_outage(serve, proxied, pg_url: PgUrl,
                                                   tmp_path) -> None:
    """PostgreSQL unreachable for 10 s mid-crawl (every connection cut, new ones refused): both
    workers keep each origin's delay, reconnect, and finish; no page is fetched twice, none is
    lost."""
    proxy, url = proxied
    names, n, delay = ["a", "b", "c", "d"], 30, 0.2
    site = serve({name: {"/": Page(html(name, [f"/p{i}" for i in range(n)])),
                         **{f"/p{i}": Page(html(f"{name} {i} " + "x " * i, [], body=f"{i} " * i))
                            for i in range(n)}} for name in names})
    toml = tmp_path / "crawl.toml"  # the default leases (30 s) outlast the outage (trusted for
    # 24 s after a renewal sent at most 5 s before the cut); the limit is well above it
    toml.write_text("[fleet]\nreconnect_seconds = 40\npartitions = 8\n")
    assert courtly("add-seeds", *(site.url(name) for name in names), "--db", url).status == 0
    procs = [courtly_process("worker", "--db", url, "--min-delay", str(delay), "--progress",
                             "off", "--config", toml) for _ in range(2)]
    deadline = time.monotonic() + 30
    while len(rows(pg_url, "SELECT id FROM crawl_log")) < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    proxy.cut()
    cut_at = time.monotonic()
    fetched_at_cut = len(site.hits)
    time.sleep(10)
    assert all(p.poll() is None for p in procs), "a worker gave up during the outage"
    proxy.start()
    errs = []
    for proc in procs:
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
        errs.append(err)
    assert any("reconnecting" in err or "unreachable" in err for err in errs)
    assert len(site.hits) > fetched_at_cut and time.monotonic() - cut_at > 10
    all_urls = {site.url(name, p) for name in names for p in ["/", *(f"/p{i}" for i in range(n))]}
    counts = Counter(r["url"] for r in rows(pg_url, "SELECT url FROM crawl_log"))
    assert set(counts) == all_urls and max(counts.values()) == 1
    for name in names:  # on the wire: each page once, one request at a time, the delay kept
        paths = fetched_paths(site, name)
        assert sorted(paths) == sorted(set(paths)), f"{name}: a page was fetched twice"
        hits = site.hits_for(name)
        for before, after in itertools.pairwise(hits):
            assert after.arrived >= before.done
            assert after.arrived - before.done >= delay - 0.01, f"{name}: delay not kept"


def test_sigterm_gives_the_leases_back(serve, pg_url: PgUrl) -> None:
    pages = {"/": Page(html("home", [f"/p{i}" for i in range(30)]))}
    pages |= {f"/p{i}": Page(html(f"p{i} " + "y " * i, []), delay=0.01) for i in range(30)}
    site = serve({"a": pages})
    proc = courtly_process("crawl", site.url("a"), "--db", pg_url, "--min-delay", "0.1",
                           "--progress", "off")
    deadline = time.monotonic() + 20
    while len(fetched_paths(site, "a")) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "stopped by SIGTERM" in err
    assert rows(pg_url, "SELECT COUNT(*) AS n FROM leases WHERE worker IS NOT NULL")[0]["n"] == 0
    assert rows(pg_url, "SELECT stopped FROM workers")[0]["stopped"] is not None
    # the run is not finished; the next worker resumes it without waiting for any lease
    resumed = courtly("crawl", "--db", pg_url, "--min-delay", "0")
    assert resumed.status == 0, resumed.err
    assert len(rows(pg_url, "SELECT id FROM runs")) == 1
    counts = Counter(r["url"] for r in rows(pg_url, "SELECT url FROM crawl_log"))
    assert len(counts) == 31 and max(counts.values()) == 1


def test_pages_look_ups_queued_together_are_one_round_trip(pg_url: PgUrl) -> None:
    """The database thread sends the look-ups of the pages queued at one wake in one pipeline;
    each answer is the one it gets alone, and a batch the database fails is asked again one by
    one, so that only the failing look-up gets the error."""
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    origin = "http://a.example"
    store.add_links([Link(f"{origin}/{i}", origin, 0) for i in range(3)])
    first, second, third = store.take_todo(origin, 1, 3, 0.0)
    signature = random.Random(28).randbytes(dedup.PACK.size)
    kept = CrawlAction(first, origin, ExitCode.OK, 0.0, http_status=200, content_hash="h1")
    kept.near_signature = signature
    store.record(kept, 1)
    links = [first.url, f"{origin}/new", second.url]
    asked = [("h1", None, second.url, 0.8, None, 1.0),  # an exact duplicate of the first
             ("h2", signature, third.url, 0.8, None, 1.0),  # a near-duplicate of it
             (None, None, third.url, 0.8, links, 1.0),  # its links: the new one is unsettled
             (None, None, third.url, 0.8, None, 1.0)]  # nothing to ask
    before = store.round_trips
    expected = [store.page_lookups(*args) for args in asked]
    alone = store.round_trips - before  # 3 statements and the near-duplicate's find_similar
    assert expected[0][0] == first.url and expected[1][1] is not None
    assert expected[1][1][0] == first.url and expected[2][2] == [f"{origin}/new"]
    bad = (3, None, third.url, 0.8, None, 1.0)  # a hash that is no text: the server refuses

    async def together(calls: Sequence[tuple[Any, ...]]) -> list[object]:
        db = Database(store)
        assert db.thread is not None
        try:
            with db.thread._ready:  # the thread takes them at one wake
                futures = [db.thread.later(store.page_lookups, *args) for args in calls]
            return list(await asyncio.gather(*futures, return_exceptions=True))
        finally:
            db.close()

    before = store.round_trips
    assert asyncio.run(together(asked)) == expected
    assert store.round_trips - before == alone - 2  # the three statements in one pipeline
    answers = asyncio.run(together([asked[0], bad, asked[2]]))
    assert answers[0] == expected[0] and answers[2] == expected[2]
    assert isinstance(answers[1], StoreError)
    store.close()


def test_a_batch_inserts_its_rows_in_few_statements_with_each_rows_effect(
        pg_url: PgUrl) -> None:
    """BulkSender sends an INSERT's rows as multi-row statements (chunks of 32, 16 … 1 rows of
    the same parameter types, one after another): fewer executions, the same rows as one
    statement a row; an upsert whose rows touch one key twice is sent a row at a time, so that
    the later row wins as it did."""
    store = PostgresStore(pg_url)
    conn = store._live()
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT, n BIGINT)")
    sender = BulkSender()
    plain = "INSERT INTO t (k, v, n) VALUES (%s, %s, %s)"
    rows_in = [(k, None if k % 3 else f"v{k}", k * 70_000) for k in range(37)]
    # the first row's third value is a smallint, the others' an integer: 1, then 32 and 4
    assert sender.execute(conn, [(plain, rows_in)], b"COMMIT", first=b"BEGIN") == 3
    assert conn.execute("SELECT k, v, n FROM t ORDER BY k").fetchall() == rows_in
    upsert = "INSERT INTO t (k, v, n) VALUES (%s, %s, %s) ON CONFLICT (k) DO UPDATE SET v = " \
             "excluded.v"
    once = [(1, "a", 0), (2, "b", 0), (40, "c", 0)]
    assert sender.execute(conn, [(upsert, once)], b"COMMIT", first=b"BEGIN") == 2  # 2 1
    twice = [(1, "x", 0), (1, "y", 0), (3, "z", 0)]  # one statement would raise: a row a time
    assert sender.execute(conn, [(upsert, twice)], b"COMMIT", first=b"BEGIN") == 3
    got = dict(conn.execute("SELECT k, v FROM t WHERE k IN (1, 2, 3, 40)").fetchall())
    assert got == {1: "y", 2: "b", 3: "z", 40: "c"}
    store.close()


def test_repeated_reads_survive_their_prepared_statements_deallocated(pg_url: PgUrl) -> None:
    """A todo list, a redirect chain and an origin's state are read through statements
    prepared once on the connection; after a DEALLOCATE ALL (psycopg sends one after a ROLLBACK)
    they are prepared again, not a database error."""
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    origin = "http://a.example"
    store.add_links([Link(f"{origin}/{i}", origin, 0) for i in range(4)])
    first = store.take_todo(origin, 1, 2, 0.0)
    assert store.redirect_chain(f"{origin}/0", 5) == 0
    assert store.load_origin(origin).origin == origin
    store._live().execute("DEALLOCATE ALL")
    again = store.take_todo(origin, 1, 2, 0.0)
    assert [c.url for c in again] == [c.url for c in first]  # nothing taken: read twice alike
    assert store.redirect_chain(f"{origin}/0", 5) == 0
    assert store.load_origin(origin).origin == origin
    store.close()


def test_pages_look_ups_pass_reads_queued_between_them(pg_url: PgUrl) -> None:
    """Look-ups queued around other reads (a todo list, a wait for the writes) still go in one
    pipeline at the wake; each call gets its own answer. A call that may write (any other)
    sends the look-ups queued before it first."""
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    origin, other = "http://a.example", "http://b.example"
    store.add_links([Link(f"{origin}/{i}", origin, 0) for i in range(2)]
                    + [Link(f"{other}/{i}", other, 0) for i in range(2)])
    first, second = store.take_todo(origin, 1, 2, 0.0)
    store.record(CrawlAction(first, origin, ExitCode.OK, 0.0, http_status=200,
                             content_hash="h1"), 1)
    look = [("h1", None, second.url, 0.8, None, 1.0), ("h9", None, second.url, 0.8, None, 1.0)]
    expected = [store.page_lookups(*args) for args in look]
    assert expected[0][0] == first.url and expected[1][0] is None
    before = store.round_trips
    todo = store.take_todo(other, 1, 2, 0.0)
    todo_trips = store.round_trips - before

    async def wake(with_write: bool) -> list[object]:
        db = Database(store)
        assert db.thread is not None
        try:
            with db.thread._ready:  # the thread takes them at one wake
                futures: list[asyncio.Future[Any]] = [
                    db.thread.later(store.page_lookups, *look[0]),
                    db.thread.later(store.take_todo, other, 1, 2, 0.0),
                    db.thread.committed()]
                if with_write:
                    futures.append(db.thread.later(store.add_origins, ["http://c.example"]))
                futures.append(db.thread.later(store.page_lookups, *look[1]))
            return list(await asyncio.gather(*futures))
        finally:
            db.close()

    before = store.round_trips
    answers = asyncio.run(wake(False))
    assert answers[0] == expected[0] and answers[3] == expected[1]
    assert [c.url for c in answers[1]] == [c.url for c in todo]  # type: ignore[attr-defined]
    assert store.round_trips - before == todo_trips + 1  # both look-ups in one pipeline
    before = store.round_trips
    answers = asyncio.run(wake(True))
    assert answers[0] == expected[0] and answers[4] == expected[1]
    assert store.round_trips - before > todo_trips + 1  # a write between: sent apart
    store.close()


def test_a_busy_database_thread_gathers_its_next_round_trip(pg_url: PgUrl) -> None:
    """After a wake that took BUSY jobs or more, the next waits its window: two look-ups queued
    50 ms apart go in one round trip. After a quiet wake a call goes at once, and a caller that
    blocks until its answer (a strategy's read, on the loop) ends the window."""
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    origin = "http://a.example"
    store.add_links([Link(f"{origin}/{i}", origin, 0) for i in range(2)])
    look = ("h1", None, f"{origin}/0", 0.8, [f"{origin}/1"], 1.0)
    window = 1.0

    async def run() -> tuple[float, int, list[object], float]:
        db = Database(store, window)
        thread = db.thread
        assert thread is not None

        async def busy() -> None:
            with thread._ready:  # a busy wake: BUSY jobs at once
                jobs = [thread.later(store.load_origin, origin) for _ in range(BUSY)]
            await asyncio.gather(*jobs)

        try:
            start = time.monotonic()
            await thread.call(store.load_origin, origin)  # the first wake: quiet
            quiet = time.monotonic() - start
            await busy()
            before = store.round_trips
            first = thread.later(store.page_lookups, *look)
            await asyncio.sleep(0.05)  # while the thread waits its window
            second = thread.later(store.page_lookups, *look)
            answers = list(await asyncio.gather(first, second))
            trips = store.round_trips - before
            await busy()
            third = thread.later(store.page_lookups, *look)
            await asyncio.sleep(0.05)
            start = time.monotonic()
            thread.wait(store.load_origin, origin)  # blocks the loop, as a strategy's read does
            blocked = time.monotonic() - start
            answers.append(await third)
            return quiet, trips, answers, blocked
        finally:
            db.close()

    quiet, trips, answers, blocked = asyncio.run(run())
    assert quiet < window / 2 and blocked < window / 2
    assert trips == 1
    assert answers[0] == answers[1] == answers[2] == store.page_lookups(*look)
    store.close()


def test_a_store_opens_with_descriptors_past_1024(pg_url: PgUrl) -> None:
    """Opening a store when the process already holds over 1,024 descriptors (a broad crawl's
    sockets): the pooler check waits on its connection with poll(), which select() could not."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1200
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(wanted, hard)), hard))
    held = []
    try:
        while len(held) < wanted - 100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        assert held[-1] > 1024
        store = open_store(pg_url)
        assert isinstance(store, PostgresStore)
        store.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
