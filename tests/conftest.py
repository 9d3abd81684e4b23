"""Shared fixtures: real local sites, the real `courtly` command, the real SQLite file."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from courtly import clock
from courtly.cli import main
from courtly.site import LocalSite, Page
from courtly.store.postgres import conninfo_and_schema
from courtly.store.schema import HOT_TABLES
from tests.pgserver import PgUrl, crawl_schema, pg_rows, postgres_server, require

ROBOTS_TEXT = {"Content-Type": "text/plain"}


@dataclass
class Run:
    """The outcome of one `courtly` invocation."""

    status: int
    out: str
    err: str


@pytest.fixture(autouse=True)
def _no_proxy_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests reach 127.0.0.1 directly, whatever proxy the machine running them has set."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def move_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Move courtly's clock `seconds` ahead of the real one, in this process, for this test."""
    monkeypatch.setattr(clock, "_offset", float(seconds))


def courtly(*args: str) -> Run:
    """Run the courtly command in-process (the real CLI, real network, real database)."""
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return Run(result.exit_code, result.stdout, result.stderr)


def courtly_process(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start the courtly command as a real subprocess."""
    return subprocess.Popen(
        [sys.executable, "-m", "courtly", *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})},
    )


def _faults(**variables: str) -> dict[str, str]:
    """The environment of a courtly process that loads tests/faults/sitecustomize.py."""
    path = [str(Path(__file__).parent / "faults"), os.environ.get("PYTHONPATH", "")]
    return {**variables, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def with_sqlite_pragmas(pragmas: str) -> dict[str, str]:
    """The environment of a courtly process whose SQLite connections run these PRAGMAs: a
    simulated full disk or read-only file."""
    return _faults(FAULT_SQLITE_PRAGMAS=pragmas)


def time_moved(seconds: float) -> dict[str, str]:
    """The environment of a courtly process whose clock is `seconds` ahead of the real one."""
    return _faults(FAULT_TIME_OFFSET=str(seconds))


#: what migrations 11 and 12 added (the band keys' sketches, recent keys, the filter), dropped by
#: the tests that make a database of an older schema
UNDO_MIGRATIONS_11_12 = ("ALTER TABLE near_dup_keys DROP COLUMN sketch",
                         "DROP TABLE near_dup_recent", "DROP TABLE near_dup_filter")
#: what migration 17 added (politeness across a restart), dropped by the tests that make a
#: database of an older schema
UNDO_MIGRATION_17 = ("ALTER TABLE origins DROP COLUMN last_request",
                     "ALTER TABLE runs DROP COLUMN stopped")
#: migration 13 undone on PostgreSQL (dropping `part` drops the keys that name it); SQLite's
#: schema has nothing of it
UNDO_MIGRATION_13 = (
    *(f"ALTER TABLE {table} DROP COLUMN part" for table in HOT_TABLES),
    "ALTER TABLE candidates ADD PRIMARY KEY (id), ADD UNIQUE (url)",
    "ALTER TABLE crawl_log ADD PRIMARY KEY (id)",
    "ALTER TABLE content ADD PRIMARY KEY (url)",
    "ALTER TABLE redirects ADD PRIMARY KEY (url)",
    "ALTER TABLE revisits ADD PRIMARY KEY (url, fetched)",
    "ALTER TABLE near_dup ADD PRIMARY KEY (candidate)",
    "ALTER TABLE near_dup_keys ADD CONSTRAINT near_dup_keys_6_pkey PRIMARY KEY (key, candidate)",
    "ALTER TABLE near_dup_recent ADD PRIMARY KEY (key, candidate)",
    "CREATE INDEX cand_fresh ON candidates (origin, score DESC, id, url, depth, state) "
    "WHERE state = 'NOT_CRAWLED'",
    "CREATE INDEX cand_queued ON candidates (origin, taken_run) WHERE state = 'QUEUED'",
    "CREATE INDEX cand_due ON candidates (origin, next_due) WHERE state IN ('CRAWLED', 'ERROR')",
    "CREATE INDEX crawl_log_url ON crawl_log (url)",
)


def undo_migration_13(db: Path | str) -> tuple[str, ...]:
    """The statements that take a database of schema 13 back to 12 (but its version)."""
    return UNDO_MIGRATION_13 if str(db).startswith("postgresql://") else ()
#: every band key of the near-duplicate index, merged or still recent (a subquery)
BAND_KEYS = ("(SELECT key, candidate FROM near_dup_keys UNION ALL "
             "SELECT key, candidate FROM near_dup_recent) AS k")


def execute(db: Path | str, *statements: str) -> None:
    """Change the crawl database directly (SQLite file or postgresql:// URL)."""
    if str(db).startswith("postgresql://"):
        conninfo, schema = conninfo_and_schema(str(db))
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {schema}")
            for statement in statements:
                conn.execute(statement)
        return
    con = sqlite3.connect(db)
    try:
        with con:
            for statement in statements:
                con.execute(statement)
    finally:
        con.close()


def rows(db: Path | str, sql: str, *params: Any) -> list[dict[str, Any]]:
    """Query the crawl database directly (SQLite file, or a postgresql:// URL)."""
    if str(db).startswith("postgresql://"):
        return pg_rows(str(db), sql, params)
    con = sqlite3.connect(str(db))
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(sql, params)]
    finally:
        con.close()


def candidates(db: Path | str) -> dict[str, dict[str, Any]]:
    """Crawl candidates by URL, via `courtly export`."""
    run = courtly("export", "--db", db)
    assert run.status == 0, run.err
    records = [json.loads(line) for line in run.out.splitlines()]
    return {r["url"]: r for r in records}


def fetched_paths(site: LocalSite, name: str) -> list[str]:
    """Paths requested from one origin, robots.txt excluded, in arrival order."""
    return [h.path for h in site.hits_for(name) if h.path != "/robots.txt"]


@pytest.fixture
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Path | PgUrl:
    """The crawl database: a SQLite file, or (modules with BACKENDS) a fresh PostgreSQL schema."""
    if getattr(request, "param", "sqlite") == "postgres":
        url: PgUrl = request.getfixturevalue("pg_url")
        return url
    return tmp_path / "crawl.db"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test module with BACKENDS = ("sqlite", "postgres") runs its `db` tests on each."""
    backends = getattr(metafunc.module, "BACKENDS", None)
    if backends and "db" in metafunc.fixturenames:
        metafunc.parametrize(
            "db",
            [
                pytest.param(b, marks=[pytest.mark.postgres] if b == "postgres" else [])
                for b in backends
            ],
            indirect=True,
        )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str | None]:
    """The PostgreSQL server for this session (None: unavailable, see tests/pgserver.py)."""
    with postgres_server() as url:
        yield url


@pytest.fixture
def pg_url(pg_server: str | None) -> Iterator[PgUrl]:
    """A postgresql:// crawl database URL with a schema of its own, dropped after the test."""
    with crawl_schema(require(pg_server)) as url:
        yield url


@pytest.fixture
def serve() -> Iterator[Any]:
    """serve({name: {path: Page}}) → a started LocalSite, stopped after the test."""
    started: list[LocalSite] = []

    def start(sites: dict[str, dict[str, Any]]) -> LocalSite:
        site = LocalSite(sites).__enter__()
        started.append(site)
        return site

    yield start
    for site in started:
        site.__exit__(None, None, None)


def robots(text: str) -> Page:
    """A robots.txt page."""
    return Page(text, headers=ROBOTS_TEXT)
