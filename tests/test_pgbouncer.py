"""Workers through PgBouncer (Debian's `pgbouncer`, started by the test on a port of its own):
session mode works; transaction mode would hand one client's session state to another, which is
why docs/distributed.md requires session mode, and why courtly refuses it with one line."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from courtly.site import Page, html
from tests.conftest import courtly, courtly_process, rows
from tests.pgserver import PgUrl

pytestmark = pytest.mark.postgres


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def pgbouncer(server: str, mode: str, pool_size: int) -> Iterator[str]:
    """PgBouncer in `mode` in front of the server's database; yields its postgresql:// URL."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    assert Path(binary).exists(), "pgbouncer is not installed (apt-get install pgbouncer)"
    target = urlsplit(server)
    user = target.username or "postgres"
    database = target.path.lstrip("/")
    port = _free_port()
    root = Path(tempfile.mkdtemp(prefix="courtly-pgbouncer-"))
    (root / "users.txt").write_text(f'"{user}" ""\n')
    (root / "pgbouncer.ini").write_text(
        f"[databases]\n{database} = host={target.hostname} port={target.port or 5432} "
        f"dbname={database}\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {root}/users.txt\npool_mode = {mode}\n"
        f"default_pool_size = {pool_size}\nmax_client_conn = 100\n"
        f"logfile = {root}/pgbouncer.log\n"
    )
    command = [binary]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        account = pwd.getpwnam("postgres")
        os.chown(root, account.pw_uid, account.pw_gid)
        for path in root.iterdir():
            os.chown(path, account.pw_uid, account.pw_gid)
        command += ["-u", "postgres"]
    proc = subprocess.Popen([*command, str(root / "pgbouncer.ini")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"postgresql://{user}@127.0.0.1:{port}/{database}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, "pgbouncer did not start"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def _through(bouncer: str, pg_url: PgUrl) -> str:
    """The test's crawl database URL (its schema) through PgBouncer."""
    return f"{bouncer}?{pg_url.partition('?')[2]}"


def test_two_workers_crawl_through_pgbouncer_in_session_mode(serve, pg_url: PgUrl,
                                                             tmp_path: Path) -> None:
    names = ["a", "b", "c"]
    site = serve({n: {"/": Page(html(n, [f"/p{k}" for k in range(8)])),
                      **{f"/p{k}": Page(html(f"{n} {k} " + "w " * k, [f"/p{(k + 1) % 8}"]))
                         for k in range(8)}} for n in names})
    toml = tmp_path / "fleet.toml"
    toml.write_text("[fleet]\nlease_seconds = 2\npartitions = 8\n")
    with pgbouncer(pg_url.partition("?")[0], "session", pool_size=4) as bouncer:
        url = _through(bouncer, pg_url)
        assert courtly("add-seeds", *(site.url(n) for n in names), "--db", url).status == 0
        procs = [courtly_process("worker", "--db", url, "--min-delay", "0.05", "--progress",
                                 "off", "--config", toml) for _ in range(2)]
        for proc in procs:
            _, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err
    counts = Counter(r["url"] for r in rows(pg_url, "SELECT url FROM crawl_log"))
    assert len(counts) == 3 * 9 and max(counts.values()) == 1
    workers = rows(pg_url, "SELECT stopped FROM workers")  # both joined, both left cleanly
    assert len(workers) == 2 and all(w["stopped"] is not None for w in workers)


def test_transaction_mode_hands_a_session_setting_to_another_client(pg_url: PgUrl) -> None:
    """Why session mode: the search_path a worker sets for its crawl's schema would be another
    client's (and its own next statement may run on a server connection without it)."""
    with pgbouncer(pg_url.partition("?")[0], "transaction", pool_size=1) as bouncer, \
            psycopg.connect(bouncer, autocommit=True) as first, \
            psycopg.connect(bouncer, autocommit=True) as second:
        first.execute("SET search_path TO courtly_somebody_elses")
        row = second.execute("SHOW search_path").fetchone()
        assert row is not None and row[0] == "courtly_somebody_elses"


def test_transaction_pooling_is_refused_with_one_line(pg_url: PgUrl) -> None:
    """courtly sees that the pooler hands its session on (its second session gets the server
    connection its first just used) and says it needs session mode, before it sets anything
    on a server connection or creates its schema."""
    with pgbouncer(pg_url.partition("?")[0], "transaction", pool_size=2) as bouncer:
        url = _through(bouncer, pg_url)
        for command in (["add-seeds", "http://127.0.0.1:9/"], ["worker", "--progress", "off"]):
            result = courtly(*command, "--db", url)
            assert result.status != 0
            lines = result.err.strip().splitlines()
            assert len(lines) == 1 and "needs session pooling" in lines[0], result.err
    schema = pg_url.partition("schema=")[2].partition("&")[0]
    with psycopg.connect(pg_url.partition("?")[0]) as conn:
        made = conn.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s",
                            (schema,)).fetchone()
    assert made is None
