"""The HTTP exchange of a kept page: the request as sent, the response head as received."""

from __future__ import annotations

from io import BytesIO
from pathlib import Path
from typing import Any

import zstandard
from warcio.archiveiterator import ArchiveIterator

from courtly.site import Page, html
from courtly.store.schema import MIGRATIONS
from tests.conftest import (
    UNDO_MIGRATION_17,
    UNDO_MIGRATIONS_11_12,
    courtly,
    execute,
    rows,
    undo_migration_13,
)
from tests.hostile_server import HostileServer, routes

BACKENDS = ("sqlite", "postgres")  # the `db` tests run on both (tests/conftest.py)

BODY = html("Home", ["/a"]).encode()
#: a head as a server may send it: its own reason phrase, names in odd case, a repeated header
HEAD = (b"HTTP/1.1 200 Fine Thanks\r\nX-Odd-CASE: Mixed Value\r\nSet-Cookie: a=1\r\n"
        b"content-type: text/html\r\nSet-Cookie: b=2\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n" % len(BODY))


def exchanges(db: Path | str) -> dict[str, tuple[bytes, bytes]]:
    """The stored exchanges by URL: (request head, response head)."""
    out = {}
    for row in rows(db, "SELECT url, exchange FROM content"):
        data = zstandard.ZstdDecompressor().decompress(bytes(row["exchange"]))
        request, _, head = data.partition(b"\r\n\r\n")
        out[row["url"]] = (request + b"\r\n\r\n", head)
    return out


def test_the_response_head_as_received_and_the_request_as_sent(db: Any) -> None:
    pages = {"/": HEAD + BODY, "/a": HEAD + BODY}
    with HostileServer({"raw": routes(pages)}) as server:
        origin = server.origins["raw"]
        run = courtly("crawl", origin + "/", "--db", db, "--min-delay", "0",
                      "--user-agent", "archivist/1.0")
        assert run.status == 0, run.err
    stored = exchanges(db)
    assert set(stored) == {origin + "/"}  # /a is an exact duplicate: no content of its own
    request, head = stored[origin + "/"]
    assert head == HEAD
    host = origin.removeprefix("http://")
    assert request.startswith(b"GET / HTTP/1.1\r\nHost: %s\r\nUser-Agent: archivist/1.0\r\n"
                              % host.encode())
    assert request.endswith(b"\r\n\r\n") and request.count(b"\r\n\r\n") == 1


def test_a_database_of_schema_8_opens_and_crawls(serve, db: Any, tmp_path: Path) -> None:
    site = serve({"one": {"/": Page(html("Home", ["/a"])), "/a": Page(html("A", []))}})
    origin = site.origins["one"]
    assert courtly("crawl", site.url("one"), "--db", db, "--min-delay", "0").status == 0
    execute(db, *undo_migration_13(db),
            "ALTER TABLE content DROP COLUMN exchange", "DROP TABLE revisits",
            "ALTER TABLE leases DROP COLUMN epoch",  # added by migration 10
            *UNDO_MIGRATIONS_11_12, *UNDO_MIGRATION_17,
            "UPDATE schema_version SET version = 8")  # as schema 8 left it
    out = tmp_path / "old.warc.gz"  # its pages have no exchange: resource records
    assert courtly("export", "--db", db, "--format", "warc", "--out", out).status == 0
    kinds = [r.rec_type for r in ArchiveIterator(BytesIO(out.read_bytes()))]
    assert kinds == ["warcinfo", "resource", "resource"]
    run = courtly("crawl", "--db", db, "--min-delay", "0", "--force-recrawl")
    assert run.status == 0, run.err
    assert rows(db, "SELECT version FROM schema_version") == [{"version": len(MIGRATIONS)}]
    stored = exchanges(db)
    assert set(stored) == {origin + "/", origin + "/a"}
    assert all(head.startswith(b"HTTP/1.1 200 OK\r\n") for _, head in stored.values())
