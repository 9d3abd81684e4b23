"""A PostgreSQL server for the tests: the one on 127.0.0.1:5432, or a temporary one.

COURTLY_TEST_POSTGRES (a libpq URL, default postgresql://postgres@127.0.0.1:5432/test) names the
server. When it does not answer and initdb/pg_ctl are installed (/usr/lib/postgresql/*/bin or on
PATH), a temporary cluster is started on a free 127.0.0.1 port for the session. Otherwise the
PostgreSQL tests are skipped with the reason, unless COURTLY_REQUIRE_POSTGRES=1 (CI), which turns
the skip into a failure. Each test gets its own schema (`?schema=courtly_test_…`, a parameter
courtly strips and creates), dropped afterwards.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


class PgUrl(str):
    """A postgresql:// crawl database URL that, like a Path, knows whether it exists."""

    __slots__ = ()

    def exists(self) -> bool:
        from courtly.store.postgres import database_exists

        return database_exists(self)


def _answers(url: str) -> str | None:
    """None if the server answers, else why not."""
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return None
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0]


def _binaries() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return os.path.dirname(found[-1])
    pg_ctl = shutil.which("pg_ctl")
    return os.path.dirname(pg_ctl) if pg_ctl else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def temporary_server(bindir: str) -> Iterator[str]:
    """initdb + pg_ctl start on a free port; as root, the cluster runs as user postgres."""
    root = tempfile.mkdtemp(prefix="courtly-pg-")
    data = os.path.join(root, "data")
    prefix: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    run: dict[str, Any] = {"check": True, "capture_output": True, "timeout": 120}
    subprocess.run(
        [*prefix, f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres"], **run
    )
    subprocess.run(
        [
            *prefix,
            f"{bindir}/pg_ctl",
            "-D",
            data,
            "-w",
            "-l",
            f"{root}/log",
            "-o",
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1",
            "start",
        ],
        **run,
    )
    try:
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE test")
        yield f"postgresql://postgres@127.0.0.1:{port}/test"
    finally:
        subprocess.run(
            [*prefix, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server() -> Iterator[str | None]:
    """Yield a server URL, or None (with the reason in `unavailable`) when there is none."""
    url = os.environ.get("COURTLY_TEST_POSTGRES", DEFAULT_URL)
    why = _answers(url)
    if why is None:
        yield url
        return
    bindir = _binaries()
    if bindir is None:
        unavailable.append(f"no PostgreSQL server at {url} ({why}) and no initdb/pg_ctl found")
        yield None
        return
    try:
        server = temporary_server(bindir)
        started = server.__enter__()
    except (OSError, KeyError, subprocess.SubprocessError) as exc:
        unavailable.append(
            f"no PostgreSQL server at {url} ({why}); starting a temporary one failed: {exc}"
        )
        yield None
        return
    try:
        yield started
    finally:
        server.__exit__(None, None, None)


unavailable: list[str] = []


def require(base: str | None) -> str:
    """The server URL, or skip (fail under COURTLY_REQUIRE_POSTGRES=1) with the reason."""
    if base is not None:
        return base
    reason = unavailable[-1] if unavailable else "no PostgreSQL server"
    if os.environ.get("COURTLY_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"COURTLY_REQUIRE_POSTGRES=1 but {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def crawl_schema(base: str) -> Iterator[PgUrl]:
    """A fresh schema for one test, dropped afterwards."""
    schema = f"courtly_test_{uuid.uuid4().hex[:10]}"
    sep = "&" if "?" in base else "?"
    try:
        yield PgUrl(f"{base}{sep}schema={schema}")
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def pg_rows(url: str, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Query a crawl schema directly ('?' placeholders, as with sqlite3)."""
    from psycopg.rows import dict_row

    from courtly.store.postgres import conninfo_and_schema

    conninfo, schema = conninfo_and_schema(url)
    with psycopg.connect(conninfo, autocommit=True, row_factory=dict_row) as conn:
        if schema:
            conn.execute(f"SET search_path TO {schema}")
        return list(conn.execute(sql.replace("%", "%%").replace("?", "%s"), params))
