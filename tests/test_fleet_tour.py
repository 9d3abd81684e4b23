"""A fleet as README's "Running many workers" has a user run it: real `courtly worker` processes
on one PostgreSQL crawl database (a schema of the test's own), real local sites."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from courtly.site import Page, html
from tests.conftest import courtly, courtly_process, rows
from tests.pgserver import PgUrl
from tests.test_pgbouncer import pgbouncer

pytestmark = pytest.mark.postgres


def fleet_toml(path: Path, more: str = "") -> Path:
    """Short leases and 16 partitions (and `more` [fleet] lines)."""
    path.write_text("[fleet]\nlease_seconds = 2\npartitions = 16\n" + more)
    return path


def worker(db: PgUrl, config: Path, *flags: str) -> subprocess.Popen[str]:
    return courtly_process("worker", "--db", db, "--progress", "off", "--config", config, *flags)


def wait_for_workers(db: PgUrl, count: int) -> None:
    """Until `count` workers have registered."""
    deadline = time.monotonic() + 20
    while len(rows(db, "SELECT id FROM workers")) < count:
        assert time.monotonic() < deadline, "the worker did not register"
        time.sleep(0.05)


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


def test_a_worker_with_another_configuration_says_so_in_one_line(
        serve, pg_url: PgUrl, tmp_path: Path) -> None:
    """A worker started with other delays, another strategy or another partition count than
    the fleet's crawled with them without a word (a tenth of the fleet's delay on the sites of
    its partitions; its partitions ignored). Now it names what differs, in one warning line."""
    site = serve({"a": {"/": Page(html("A", []))}})
    assert courtly("add-seeds", site.url("a"), "--db", pg_url).status == 0
    config = fleet_toml(tmp_path / "fleet.toml")
    first = worker(pg_url, config, "--continuous", "--min-delay", "1")
    try:
        wait_for_workers(pg_url, 1)
        same = worker(pg_url, config, "--min-delay", "1", "--concurrency", "4")
        _, same_err = same.communicate(timeout=60)
        other = worker(pg_url, fleet_toml(tmp_path / "other.toml", "reconnect_seconds = 5\n"),
                       "--min-delay", "0.05", "--strategy", "depth-first")
        _, err = other.communicate(timeout=60)
    finally:
        stop(first)
    assert same.returncode == 0 and other.returncode == 0, same_err + err
    assert "differs" not in same_err, same_err  # --concurrency and [fleet]'s own: per worker
    lines = [line for line in err.splitlines() if "configuration differs" in line]
    assert len(lines) == 1, err
    assert "politeness.min_delay 0.05 (theirs: 1.0)" in lines[0]
    assert 'strategy "depth-first" (theirs: "breadth-first")' in lines[0]
    assert "reconnect_seconds" not in lines[0] and "Traceback" not in err


def test_a_partition_count_the_crawl_does_not_have_is_named(
        serve, pg_url: PgUrl, tmp_path: Path) -> None:
    """[fleet] partitions is fixed when a crawl first gets its partitions: a worker configured
    with another count used the crawl's without a word."""
    site = serve({"a": {"/": Page(html("A", []))}})
    assert courtly("add-seeds", site.url("a"), "--db", pg_url).status == 0
    first = worker(pg_url, fleet_toml(tmp_path / "fleet.toml"))
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0 and "partitions" not in err, err
    more = tmp_path / "more.toml"
    more.write_text("[fleet]\nlease_seconds = 2\npartitions = 32\n")
    second = worker(pg_url, more)
    _, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    lines = [line for line in err.splitlines() if "partitions" in line]
    assert len(lines) == 1, err
    assert "[fleet] partitions = 32 is not used: this crawl has 16 partitions" in lines[0]


def test_a_full_poolers_wait_is_named_in_one_line(pg_url: PgUrl) -> None:
    """PgBouncer in session mode with every server connection taken (a pool smaller than two
    per worker): a worker waited for one to free without a word, for the whole crawl of the
    workers that held them. Now one warning line says what it waits for, and it goes on once
    a connection frees."""
    base, _, schema = pg_url.partition("?")
    with pgbouncer(base, "session", pool_size=2) as bouncer:
        held = [psycopg.connect(bouncer, autocommit=True) for _ in range(2)]
        for conn in held:
            conn.execute("SELECT 1")  # each keeps its server connection: the pool is full
        proc = courtly_process("add-seeds", "http://127.0.0.1:9/", "--db", f"{bouncer}?{schema}")
        time.sleep(7)
        assert proc.poll() is None, proc.communicate()
        for conn in held:
            conn.close()
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    lines = [line for line in err.splitlines() if "no server connection" in line]
    assert len(lines) == 1 and "pool is full?" in lines[0], err
    assert "1 new crawl candidates" in out


def test_reconnect_seconds_bounds_the_wait_for_a_full_pooler(pg_url: PgUrl, tmp_path: Path
                                                            ) -> None:
    """`[fleet] reconnect_seconds = 2` was read only once the crawl began: the first connection
    waited the default 60 s more for a full pooler. Now it gives up after 5 + 2 s."""
    base, _, schema = pg_url.partition("?")
    config = fleet_toml(tmp_path / "fleet.toml", "reconnect_seconds = 2\n")
    with pgbouncer(base, "session", pool_size=1) as bouncer, psycopg.connect(
            bouncer, autocommit=True) as held:
        held.execute("SELECT 1")  # it keeps the one server connection: the pool is full
        run = courtly_process("add-seeds", "http://127.0.0.1:9/", "--config", config,
                              "--db", f"{bouncer}?{schema}")
        _, err = run.communicate(timeout=30)
    assert run.returncode == 1, err
    assert err.splitlines()[-1].startswith("courtly: cannot connect to "), err
    assert "no server connection in 7s" in err


def test_stats_names_each_worker_whole_on_a_narrow_terminal(
        serve, pg_url: PgUrl, tmp_path: Path) -> None:
    """`courtly stats` on 80 columns cut the workers' ids (`vm:14462:…`): not one could be
    matched with the log lines that name workers by their id."""
    site = serve({"a": {"/": Page(html("A", []))}})
    assert courtly("add-seeds", site.url("a"), "--db", pg_url).status == 0
    crawling = worker(pg_url, fleet_toml(tmp_path / "fleet.toml"))
    _, err = crawling.communicate(timeout=60)
    assert crawling.returncode == 0, err
    (ident,) = [r["id"] for r in rows(pg_url, "SELECT id FROM workers")]
    stats = courtly_process("stats", "--db", pg_url, env={"COLUMNS": "80"})
    out, err = stats.communicate(timeout=60)
    assert stats.returncode == 0, err
    assert ident in out, out


def test_a_full_disk_on_postgresql_is_one_line(serve, pg_url: PgUrl) -> None:
    """PostgreSQL out of disk (SQLSTATE 53100, raised by a trigger once 5 pages are logged): the
    worker said it twice, a logged `ERROR database error: …` and then the `courtly: …` line."""
    site = serve({"a": {"/": Page(html("Home", [f"/p{i}" for i in range(20)]))}
                  | {f"/p{i}": Page(html(f"P{i}", [])) for i in range(20)}})
    assert courtly("add-seeds", site.url("a"), "--db", pg_url).status == 0
    schema = pg_url.partition("schema=")[2].partition("&")[0]
    with psycopg.connect(pg_url.partition("?")[0], autocommit=True) as conn:
        conn.execute(f"CREATE FUNCTION {schema}.no_room() RETURNS trigger AS $$ BEGIN IF (SELECT "
                     f"count(*) FROM {schema}.crawl_log) >= 5 THEN RAISE EXCEPTION 'could not "
                     "extend file: No space left on device' USING ERRCODE = '53100'; END IF; "
                     "RETURN NEW; END $$ LANGUAGE plpgsql")
        conn.execute(f"CREATE TRIGGER no_room BEFORE INSERT ON {schema}.crawl_log FOR EACH ROW "
                     f"EXECUTE FUNCTION {schema}.no_room()")
    proc = courtly_process("worker", "--db", pg_url, "--min-delay", "0", "--progress", "off")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    [line] = [line for line in err.splitlines() if "No space left" in line]
    assert line.startswith("courtly: disk full on postgresql://"), err
