"""A mistyped database URL or a damaged crawl database is one line and exit status 1, never a
traceback (SQLite lets any column hold any type, so a hand edit can store text in a number)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from courtly.site import LocalSite, Page, html
from courtly.store.postgres import conninfo_and_schema
from tests.conftest import BAND_KEYS, courtly, robots
from tests.pgserver import PgUrl

COMMANDS = ("stats", "add-seeds", "worker", "crawl")


def one_line_error(run_status: int, err: str, *expected: str) -> None:
    assert run_status == 1, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for text in expected:
        assert text in err, err


def run_with(command: str, db: str) -> tuple[int, str]:
    seeds = ("http://127.0.0.1:9/",) if command in ("add-seeds", "crawl") else ()
    run = courtly(command, *seeds, "--db", db)
    return run.status, run.err


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("url", "why"), [
    ("postgresql://127.0.0.1:99999/test", "99999"),
    ("postgresql://127.0.0.1:abc/test", '"abc"'),
    ("postgresql://[::1/test", "IPv6"),
])
def test_bad_postgresql_urls_are_one_line(command: str, url: str, why: str) -> None:
    status, err = run_with(command, url)
    one_line_error(status, err, url, why)


def test_credentials_stay_out_of_messages() -> None:
    status, err = run_with("stats", "postgresql://me:s3cret@127.0.0.1:99999/test?password=s3cret")
    one_line_error(status, err, "postgresql://127.0.0.1:99999/test")
    assert "s3cret" not in err and "me:" not in err


def test_host_in_the_query_string(pg_url: PgUrl) -> None:
    """postgresql:///dbname?host=… is a valid libpq URL: the empty authority is kept."""
    conninfo, schema = conninfo_and_schema(pg_url)
    server = conninfo_to_dict(conninfo)
    url = (f"postgresql:///{server['dbname']}?host={server['host']}&port={server['port']}"
           f"&user={server['user']}&schema={schema}")
    site = LocalSite({"a": {"/robots.txt": robots(""), "/": Page(html("Home", []))}})
    with site:
        run = courtly("crawl", site.url("a"), "--db", url, "--min-delay", "0",
                      "--progress", "off")
    assert run.status == 0, run.err
    stats = courtly("stats", "--db", url)
    assert stats.status == 0 and "CRAWLED" in stats.out, stats.err
    missing = courtly("stats", "--db", "postgresql:///test?host=127.0.0.1&port=1")
    one_line_error(missing.status, missing.err, "postgresql:///test?host=127.0.0.1&port=1")


# -- damaged contents (SQLite: any column holds any type) -----------------------------------
@pytest.fixture
def crawled(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A finished crawl of one small site, still served: (database, the site's origin)."""
    db = tmp_path / "crawl.db"
    pages = {"/robots.txt": robots("Sitemap: /sitemap.xml\n"),
             "/": Page(html("Home", ["/a", "/b"])), "/a": Page(html("A", ["/b"])),
             "/b": Page(html("B", []))}
    with LocalSite({"a": pages}) as site:
        run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--progress", "off")
        assert run.status == 0, run.err
        yield db, site.url("a").rstrip("/")


def damage(db: Path, sql: str, *params: object) -> None:
    con = sqlite3.connect(db)
    with con:
        con.execute(sql, params)
    con.close()


@pytest.mark.parametrize("command", ["stats", "add-seeds", "crawl", "export"])
def test_text_schema_version(crawled: tuple[Path, str], command: str) -> None:
    db, _ = crawled
    damage(db, "UPDATE schema_version SET version = 'abc'")
    status, err = run_with(command, str(db))
    one_line_error(status, err, f"{db} is damaged", "schema_version", "'abc'")


@pytest.mark.parametrize("command", ["stats", "add-seeds", "crawl", "export"])
@pytest.mark.parametrize(("edit", "why"), [
    ("DELETE FROM schema_version", "schema_version is empty"),
    ("INSERT INTO schema_version SELECT version FROM schema_version", "schema_version has 2 rows"),
])
def test_schema_version_without_its_one_row(crawled: tuple[Path, str], command: str, edit: str,
                                            why: str) -> None:
    """An emptied schema_version said `database error on …: table origins already exists` (its
    migrations ran again on the crawl's tables)."""
    db, _ = crawled
    damage(db, edit)
    status, err = run_with(command, str(db))
    one_line_error(status, err, f"{db} is damaged: {why}")


def test_schema_version_emptied_in_postgresql(pg_url: PgUrl) -> None:
    assert courtly("add-seeds", "http://127.0.0.1:9/", "--db", pg_url).status == 0
    conninfo, schema = conninfo_and_schema(pg_url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        conn.execute("DELETE FROM schema_version")
    for command in COMMANDS:
        status, err = run_with(command, pg_url)
        one_line_error(status, err, "is damaged: schema_version is empty")


@pytest.mark.parametrize(("column", "value"), [
    ("sitemaps", "not json"), ("sitemaps", '{"a": 1}'), ("metadata", "[1]"),
    ("backoff_until", "soon"), ("backoff_level", "high"), ("robots_status", "ok"),
    ("crawl_delay", "NaN"), ("robots_body", 42),
])
@pytest.mark.parametrize("command", ["crawl", "check"])
def test_damaged_origin_columns(
    crawled: tuple[Path, str], column: str, value: object, command: str
) -> None:
    db, origin = crawled
    damage(db, f"UPDATE origins SET {column} = ?", value)
    damage(db, "UPDATE candidates SET state = 'NOT_CRAWLED', taken_run = NULL")  # work to do
    flags = ("--min-delay", "0", "--progress", "off") if command == "crawl" else ()
    run = courtly(command, origin + "/", "--db", db, *flags)
    one_line_error(run.status, run.err, f"{db} is damaged", f"origins.{column}", origin)


@pytest.mark.parametrize(("column", "value"), [
    ("depth", "deep"), ("score", "high"), ("attempts", "many"), ("recrawl_interval", "daily"),
])
def test_damaged_candidate_columns(
    crawled: tuple[Path, str], column: str, value: str
) -> None:
    db, origin = crawled
    url = origin + "/a"
    (row,) = [r[0] for r in sqlite3.connect(db).execute(
        "SELECT id FROM candidates WHERE url = ?", (url,))]
    damage(db, f"UPDATE candidates SET {column} = ?, state = 'QUEUED', taken_run = NULL "
               "WHERE url = ?", value, url)
    run = courtly("crawl", "--db", db, "--min-delay", "0", "--progress", "off")
    one_line_error(run.status, run.err, f"{db} is damaged", f"candidates.{column}",
                   f"id {row}", repr(value))
    if column in ("depth", "score"):
        check = courtly("check", url, "--db", db)
        one_line_error(check.status, check.err, f"candidates.{column}", url)


def test_damaged_candidate_state(crawled: tuple[Path, str]) -> None:
    """Links found on a page are looked up (Store.states): /a links to /b."""
    db, origin = crawled
    damage(db, "UPDATE candidates SET state = 'LOST' WHERE url = ?", origin + "/b")
    damage(db, "UPDATE candidates SET state = 'QUEUED', taken_run = NULL WHERE url = ?",
           origin + "/a")
    run = courtly("crawl", "--db", db, "--min-delay", "0", "--progress", "off")
    # raised while handling /a's response: the crawler decides what that stops (crawler.py)
    assert "Traceback" not in run.err
    assert f"{db} is damaged: candidates.state of {origin}/b is 'LOST'" in run.err, run.err


def test_damaged_origin_in_postgresql(pg_url: PgUrl) -> None:
    """PostgreSQL enforces the number columns, not what a TEXT column holds."""
    with LocalSite({"a": {"/robots.txt": robots(""), "/": Page(html("Home", []))}}) as site:
        run = courtly("crawl", site.url("a"), "--db", pg_url, "--min-delay", "0",
                      "--progress", "off")
        assert run.status == 0, run.err
    conninfo, schema = conninfo_and_schema(pg_url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        conn.execute("UPDATE origins SET sitemaps = 'not json'")
    run = courtly("check", site.url("a"), "--db", pg_url)
    one_line_error(run.status, run.err, "is damaged: origins.sitemaps of", site.url("a")[:-1])


@pytest.mark.parametrize("value", ["not a signature", b"\x01\x02"])
def test_damaged_near_duplicate_signature(tmp_path: Path, value: object) -> None:
    """A stored signature that is not one is a damaged database, named, not an internal error."""
    db = tmp_path / "crawl.db"
    text = " ".join(f"word{i % 97} term{i % 13}" for i in range(200))
    near = text.replace("word5 ", "changed ", 1)
    pages = {"/robots.txt": robots(""), "/": Page(html("Home", ["/a"])),
             "/a": Page(html("A", [], body=text)), "/b": Page(html("B", [], body=near))}
    with LocalSite({"a": pages}) as site:
        origin = site.url("a").rstrip("/")
        run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--progress", "off")
        assert run.status == 0, run.err
        damage(db, "UPDATE near_dup SET signature = ?", value)
        run = courtly("crawl", origin + "/b", "--db", db, "--min-delay", "0", "--progress", "off")
    assert "Traceback" not in run.err
    assert f"{db} is damaged: near_dup.signature of {origin}/a is" in run.err, run.err


def test_a_damaged_signature_is_replaced_when_its_page_is_crawled_again(tmp_path: Path) -> None:
    """Recrawling a page whose stored signature is damaged stores a new one with its keys."""
    db = tmp_path / "crawl.db"
    text = " ".join(f"word{i % 97} term{i % 13}" for i in range(200))
    pages = {"/robots.txt": robots(""), "/": Page(html("Home", [], body=text))}
    with LocalSite({"a": pages}) as site:
        run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--progress", "off")
        assert run.status == 0, run.err
        con = sqlite3.connect(db)
        good = con.execute("SELECT signature FROM near_dup").fetchone()[0]
        keys = con.execute(f"SELECT key FROM {BAND_KEYS} ORDER BY key").fetchall()
        con.close()
        damage(db, "UPDATE near_dup SET signature = 'damaged'")
        damage(db, "UPDATE candidates SET state = 'QUEUED', taken_run = NULL")
        run = courtly("crawl", "--db", db, "--min-delay", "0", "--progress", "off")
    assert run.status == 0 and "Traceback" not in run.err, run.err
    con = sqlite3.connect(db)
    assert con.execute("SELECT signature FROM near_dup").fetchall() == [(good,)]
    assert con.execute(f"SELECT key FROM {BAND_KEYS} ORDER BY key").fetchall() == keys
    con.close()
