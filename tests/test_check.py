"""`courtly check URL` explains each case: scope, policy rule, robots rule, stored state."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from courtly.site import Page, html
from courtly.store.schema import MIGRATIONS
from tests.conftest import UNDO_MIGRATION_17, UNDO_MIGRATIONS_11_12, courtly, robots


def test_check_explains_policy_robots_scope_and_state(serve, tmp_path: Path) -> None:
    db = tmp_path / "crawl.db"
    site = serve({"a": {"/robots.txt": robots("User-agent: *\nDisallow: /nope\n"),
                        "/": Page(html("Home", ["/nope", "/private/x", "/ok?b=1&a=2"])),
                        "/ok?a=2&b=1": Page(html("OK", []))}})
    config = tmp_path / "crawl.toml"
    config.write_text('[policies]\ndo_not_crawl = ["/private/"]\n')
    assert courtly("crawl", site.url("a"), "--db", db, "--config", config,
                   "--min-delay", "0").status == 0

    def check(url: str) -> str:
        run = courtly("check", url, "--db", db, "--config", config)
        assert run.status == 0, run.err
        return run.out

    out = check(site.url("a", "/ok?b=1&a=2#frag"))
    assert f"normalized: {site.url('a', '/ok?a=2&b=1')}" in out
    assert "verdict: crawlable" in out and "CRAWLED, last exit code OK" in out
    out = check(site.url("a", "/private/x"))
    assert "refused: do_not_crawl: /private/" in out
    assert "BLOCKED_URL_BY_LOCAL_POLICY" in out
    out = check(site.url("a", "/nope"))
    assert "disallowed: Disallow: /nope" in out and "BLOCKED_BY_ROBOTS_TXT" in out
    out = check("http://127.0.0.1:9/elsewhere")
    assert "NOT in scope" in out and "unknown URL" in out
    assert "not a valid http(s) URL" in check("mailto:someone@example.org")


def test_a_database_of_schema_7_gets_the_robots_error_column(serve, tmp_path: Path) -> None:
    db = tmp_path / "crawl.db"
    site = serve({"a": {"/robots.txt": robots("User-agent: *\nDisallow: /nope\n"),
                        "/": Page(html("Home", []))}})
    assert courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0").status == 0
    con = sqlite3.connect(db)  # as schema 7 left it
    con.execute("ALTER TABLE origins DROP COLUMN robots_error")
    con.execute("ALTER TABLE content DROP COLUMN exchange")  # added by migration 9
    con.execute("DROP TABLE revisits")
    con.execute("ALTER TABLE leases DROP COLUMN epoch")  # added by migration 10
    for statement in (*UNDO_MIGRATIONS_11_12, *UNDO_MIGRATION_17):
        con.execute(statement)
    con.execute("UPDATE schema_version SET version = 7")
    con.commit()
    con.close()
    out = courtly("check", site.url("a", "/nope"), "--db", db).out  # opening it migrates it
    assert "disallowed: Disallow: /nope" in out  # the stored robots.txt is still there
    con = sqlite3.connect(db)
    assert con.execute("SELECT robots_error FROM origins").fetchall() == [(None,)]
    assert con.execute("SELECT version FROM schema_version").fetchone()[0] == len(MIGRATIONS)
