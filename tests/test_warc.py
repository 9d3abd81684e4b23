"""`courtly export --format warc`: the stored pages as a WARC file that WARC tools read back."""

from __future__ import annotations

import os
import pty
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from io import BytesIO
from pathlib import Path
from typing import Any

from warcio.archiveiterator import ArchiveIterator

from courtly.site import Page, html
from tests.conftest import courtly, rows
from tests.test_bad_input import one_line

BACKENDS = ("sqlite", "postgres")  # the `db` tests run on both (tests/conftest.py)

PAGES = {
    "/": Page(html("Home", ["/a", "/b", "/hidden", "/data.txt"])),
    "/a": Page(html("A", ["/"], body="caf\u00e9 " * 50)),
    "/b": Page(html("B", [], body="b" * 70_000)),  # a body larger than one read
    "/hidden": Page(html("Hidden", [], '<meta name="robots" content="noindex">')),
    "/data.txt": Page("plain text", headers={"Content-Type": "text/plain; charset=utf-8"}),
}


def records(data: bytes) -> list[dict[str, Any]]:
    """Every record of a WARC file, its digests checked."""
    out = []
    for record in ArchiveIterator(BytesIO(data), check_digests="raise"):
        headers = record.rec_headers
        out.append({"type": record.rec_type, "uri": headers.get_header("WARC-Target-URI"),
                    "date": headers.get_header("WARC-Date"),
                    "content_type": headers.get_header("Content-Type"),
                    "version": headers.protocol, "body": record.content_stream().read()})
    return out


def crawled(serve: Any, db: Path) -> str:
    site = serve({"one": dict(PAGES)})
    run = courtly("crawl", site.url("one"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    return str(site.origins["one"])


def test_warc_holds_every_stored_page_as_served(serve, db: Path, tmp_path: Path) -> None:
    started = time.time()
    origin = crawled(serve, db)
    out = tmp_path / "crawl.warc.gz"
    run = courtly("export", "--db", db, "--format", "warc", "--out", out)
    assert run.status == 0, run.err
    found = records(out.read_bytes())
    assert found[0]["type"] == "warcinfo" and found[0]["version"] == "WARC/1.1"
    assert b"courtly/" in found[0]["body"]
    pages = {r["uri"]: r for r in found[1:]}
    assert all(r["type"] == "resource" for r in found[1:])
    stored = {r["url"] for r in rows(db, "SELECT url FROM content")}
    assert set(pages) == stored and len(found) == 1 + len(stored)
    assert {origin + "/", origin + "/a", origin + "/b"} <= stored
    assert origin + "/hidden" not in pages  # noindex: its content is not kept
    for path in ("/", "/a", "/b"):
        page = pages[origin + path]
        assert page["body"] == PAGES[path].body.encode()  # type: ignore[union-attr]
        assert page["content_type"] == "text/html"
        when = datetime.fromisoformat(page["date"].replace("Z", "+00:00")).timestamp()
        assert started - 1 <= when <= time.time()


def test_warc_to_standard_output_not_to_a_terminal(serve, db: Path) -> None:
    crawled(serve, db)
    proc = subprocess.run([sys.executable, "-m", "courtly", "export", "--db", str(db),
                           "--format", "warc"], capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert len(records(proc.stdout)) == 1 + len(rows(db, "SELECT url FROM content"))
    main, terminal = pty.openpty()
    try:
        tty = subprocess.run([sys.executable, "-m", "courtly", "export", "--db", str(db),
                              "--format", "warc"], stdout=terminal, stderr=subprocess.PIPE,
                             text=True, check=False)
    finally:
        os.close(terminal)
        os.close(main)
    assert tty.returncode == 2 and tty.stderr.startswith("courtly: a WARC file is binary")


def test_a_damaged_body_is_named_and_left_out(serve, tmp_path: Path) -> None:
    db = tmp_path / "crawl.db"
    origin = crawled(serve, db)
    con = sqlite3.connect(db)
    with con:
        con.execute("UPDATE content SET body = x'00ff' WHERE url = ?", (origin + "/a",))
    con.close()
    out = tmp_path / "crawl.warc.gz"
    run = courtly("export", "--db", db, "--format", "warc", "--out", out)
    one_line(run, 1, "damaged stored pages left out of the WARC file: 1", origin + "/a")
    uris = {r["uri"] for r in records(out.read_bytes())[1:]}
    assert origin + "/" in uris and origin + "/b" in uris and origin + "/a" not in uris


def test_every_page_of_a_larger_crawl_once(serve, db: Path, tmp_path: Path) -> None:
    """More stored pages than the export reads at a time (200): none lost, none twice."""
    pages = {"/": Page(html("Home", [f"/p{i}" for i in range(450)]))}
    pages |= {f"/p{i}": Page(html(f"P{i}", [])) for i in range(450)}
    site = serve({"big": pages})
    run = courtly("crawl", site.url("big"), "--db", db, "--min-delay", "0")
    assert run.status == 0, run.err
    out = tmp_path / "big.warc.gz"
    assert courtly("export", "--db", db, "--format", "warc", "--out", out).status == 0
    uris = [r["uri"] for r in records(out.read_bytes())[1:]]
    assert len(uris) == len(set(uris)) == 451
    origin = site.origins["big"]
    assert set(uris) == {origin + "/"} | {f"{origin}/p{i}" for i in range(450)}
