"""`courtly export --format warc`: the stored pages as a WARC file that WARC tools read back."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import pty
import random
import re
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from warcio.archiveiterator import ArchiveIterator

from courtly.site import Page, html
from courtly.warc import warc_date, writer_of
from tests.conftest import courtly, rows
from tests.hostile_server import (
    Conn,
    HostileServer,
    Request,
    link_page,
    reset_mid_body,
    routes,
)
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
        http = record.http_headers
        out.append({"type": record.rec_type, "uri": headers.get_header("WARC-Target-URI"),
                    "date": headers.get_header("WARC-Date"),
                    "content_type": headers.get_header("Content-Type"),
                    "version": headers.protocol, "warc": dict(headers.headers),
                    "http": http, "body": record.content_stream().read()})
    return out


def warcio_check(*paths: Path) -> None:
    """`warcio check` passes on the files (digests, and the records as warcio reads them)."""
    tool = Path(sys.executable).with_name("warcio")
    proc = subprocess.run([str(tool), "check", "-v", *map(str, paths)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


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
    warcio_check(out)
    found = records(out.read_bytes())
    assert found[0]["type"] == "warcinfo" and found[0]["version"] == "WARC/1.1"
    assert b"courtly/" in found[0]["body"]
    assert [r["type"] for r in found[1:]] == ["response", "request"] * ((len(found) - 1) // 2)
    pages = {r["uri"]: r for r in found[1:] if r["type"] == "response"}
    requests = {r["uri"]: r for r in found[1:] if r["type"] == "request"}
    stored = {r["url"] for r in rows(db, "SELECT url FROM content")}
    assert set(pages) == set(requests) == stored and len(found) == 1 + 2 * len(stored)
    assert {origin + "/", origin + "/a", origin + "/b"} <= stored
    assert origin + "/hidden" not in pages  # noindex: its content is not kept
    for path in ("/", "/a", "/b"):
        page, request = pages[origin + path], requests[origin + path]
        assert page["body"] == PAGES[path].body.encode()  # type: ignore[union-attr]
        assert page["content_type"] == "application/http; msgtype=response"
        assert page["http"].get_statuscode() == "200"
        assert page["http"].get_header("Content-Type") == "text/html"
        assert request["warc"]["WARC-Concurrent-To"] == page["warc"]["WARC-Record-ID"]
        assert request["http"].protocol == "GET" and request["date"] == page["date"]
        assert request["http"].get_header("User-Agent").startswith("courtly/")
        assert "WARC-Payload-Digest" in page["warc"] and "WARC-Block-Digest" in page["warc"]
        when = datetime.fromisoformat(page["date"].replace("Z", "+00:00")).timestamp()
        assert started - 1 <= when <= time.time()


def test_warc_to_standard_output_not_to_a_terminal(serve, db: Path) -> None:
    crawled(serve, db)
    proc = subprocess.run([sys.executable, "-m", "courtly", "export", "--db", str(db),
                           "--format", "warc"], capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert len(records(proc.stdout)) == 1 + 2 * len(rows(db, "SELECT url FROM content"))
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
    assert len(records(out.read_bytes())) == 1 + 2 * 2
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
    uris = [r["uri"] for r in records(out.read_bytes())[1:] if r["type"] == "response"]
    assert len(uris) == len(set(uris)) == 451
    origin = site.origins["big"]
    assert set(uris) == {origin + "/"} | {f"{origin}/p{i}" for i in range(450)}


def etag_page(body: str) -> Any:
    """A page with an ETag that answers 304 to a request that has it."""

    def handler(count: int) -> Page:
        if count == 0:
            return Page(body, headers={"Content-Type": "text/html", "ETag": '"v1"'})
        return Page(b"", 304, headers={"ETag": '"v1"'})

    return handler


def test_a_recrawl_and_a_duplicate_are_revisits(serve, db: Path, tmp_path: Path) -> None:
    same = html("Same", [], body="same words " * 40)
    site = serve({"one": {"/": Page(html("Home", ["/copy", "/same"])), "/copy": Page(same),
                          "/same": etag_page(same)}})
    home, copy, dup = (site.url("one", p) for p in ("/", "/copy", "/same"))
    assert courtly("crawl", home, "--db", db, "--min-delay", "0").status == 0
    run = courtly("crawl", "--db", db, "--min-delay", "0", "--force-recrawl")
    assert run.status == 0, run.err
    assert [h.path for h in site.hits_for("one")][-1] == "/same"  # answered 304
    out = tmp_path / "recrawl.warc.gz"
    assert courtly("export", "--db", db, "--format", "warc", "--out", out).status == 0
    warcio_check(out)
    found = records(out.read_bytes())
    responses = {r["uri"]: r for r in found if r["type"] == "response"}
    assert set(responses) == {home, copy}  # /same is an exact duplicate of /copy
    revisits = sorted((r for r in found if r["type"] == "revisit"), key=lambda r: r["date"])
    profiles = [(r["uri"], r["warc"]["WARC-Profile"].rsplit("/", 1)[1],
                 r["warc"]["WARC-Refers-To-Target-URI"]) for r in revisits]
    assert profiles == [
        (dup, "identical-payload-digest", copy),  # the first crawl: a duplicate
        (home, "identical-payload-digest", home),  # the recrawl: unchanged bodies,
        (copy, "identical-payload-digest", copy),
        (dup, "server-not-modified", copy),  # and a 304 (of the duplicate: its original)
    ]
    for revisit in revisits:
        refers = responses[revisit["warc"]["WARC-Refers-To-Target-URI"]]
        assert revisit["warc"]["WARC-Refers-To"] == refers["warc"]["WARC-Record-ID"]
        assert revisit["warc"]["WARC-Refers-To-Date"] == refers["date"]
        assert revisit["warc"]["WARC-Payload-Digest"] == refers["warc"]["WARC-Payload-Digest"]
        assert revisit["body"] == b"" and revisit["date"] > refers["date"]
    # a 304 is the kept response it stands for, its header fields updated (RFC 9111 §3.2)
    assert revisits[-1]["http"].get_statuscode() == "200"
    requests = {r["warc"]["WARC-Concurrent-To"] for r in found if r["type"] == "request"}
    assert {r["warc"]["WARC-Record-ID"] for r in revisits} <= requests


def test_pywb_replays_a_304_and_an_unchanged_page_as_the_page(serve, tmp_path: Path) -> None:
    """A recrawl's revisits replay in pywb as the page they stand for. A 304's revisit held the
    304's own head: pywb replays a revisit with its own head, so the page replayed empty, 304."""
    body = html("Kept", [], body="kept words " * 40)
    first = {"Content-Type": "text/html", "ETag": '"v1"', "X-Served": "first"}

    def kept(count: int) -> Page:
        if count == 0:
            return Page(body, headers=first)
        return Page(b"", 304, {"ETag": '"v1"', "X-Served": "again"})  # no Content-Type

    site = serve({"one": {"/": Page(html("Home", ["/kept"])), "/kept": kept}})
    db, warcs = tmp_path / "crawl.db", tmp_path / "warcs"
    run = courtly("crawl", site.url("one"), "--db", db, "--min-delay", "0", "--warc", warcs)
    assert run.status == 0, run.err
    time.sleep(1.1)  # the recrawl's captures a second later: their own 14-digit timestamps
    run = courtly("crawl", "--db", db, "--min-delay", "0", "--force-recrawl", "--warc", warcs)
    assert run.status == 0, run.err
    files = sorted(warcs.glob("*.warc.gz"))
    warcio_check(*files)
    home, page = site.url("one"), site.url("one", "/kept")
    stamps = {r["url"]: time.strftime("%Y%m%d%H%M%S", time.gmtime(r["fetched"]))
              for r in rows(db, "SELECT url, fetched FROM revisits")}
    assert set(stamps) == {home, page}
    with pywb(tmp_path / "pywb", files) as replay:
        status, headers, replayed = get(f"{replay}/crawl/{stamps[page]}id_/{page}")
        assert (status, replayed) == (200, body.encode())
        assert headers["X-Served"] == "again" and headers["Content-Type"] == "text/html"
        status, _, replayed = get(f"{replay}/crawl/{stamps[home]}id_/{home}")
        assert status == 200 and b"<title>Home</title>" in replayed


GZIPPED = html("Zipped", [], body="squeezed " * 300).encode()


async def gzip_chunked(conn: Conn, req: Request) -> None:
    """A gzip-encoded body in chunks (no Content-Length), as many servers send HTML."""
    data = gzip.compress(GZIPPED)
    await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\n"
                    b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    for i in range(0, len(data), 100):
        part = data[i:i + 100]
        await conn.send(b"%x\r\n%s\r\n" % (len(part), part))
    await conn.send(b"0\r\n\r\n")


def test_encodings_undone_and_their_headers_renamed(db: Path, tmp_path: Path) -> None:
    with HostileServer({"zip": routes({"/": gzip_chunked})}) as server:
        origin = server.origins["zip"]
        assert courtly("crawl", origin + "/", "--db", db, "--min-delay", "0").status == 0
    out = tmp_path / "zip.warc.gz"
    assert courtly("export", "--db", db, "--format", "warc", "--out", out).status == 0
    warcio_check(out)
    response = next(r for r in records(out.read_bytes()) if r["type"] == "response")
    assert response["body"] == GZIPPED
    http = response["http"]
    assert http.headers == [
        ("Content-Type", "text/html"), ("X-Crawler-Content-Encoding", "gzip"),
        ("X-Crawler-Transfer-Encoding", "chunked"), ("Connection", "close"),
        ("Content-Length", str(len(GZIPPED)))]


async def over_the_limit(conn: Conn, req: Request) -> None:
    """A chunked body (no Content-Length) that runs past the crawl's max_body_size."""
    await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n")
    with contextlib.suppress(ConnectionError):  # the crawler hangs up at its limit
        for _ in range(40):
            await conn.send(b"1000\r\n%s\r\n" % (b"h" * 0x1000))


def test_responses_cut_short_are_archived_with_why(tmp_path: Path) -> None:
    """A body over max_body_size, a connection dropped mid-body: the response was in no
    record. Now it is, as far as it came, with WARC-Truncated (length, disconnect), as Heritrix
    writes a response it cut."""
    conf = tmp_path / "crawl.toml"
    conf.write_text("[limits]\nmax_body_size = 100000\n")
    table = {"/": link_page(["/huge", "/dropped"]), "/huge": over_the_limit,
             "/dropped": reset_mid_body}
    warcs = tmp_path / "warcs"
    with HostileServer({"cut": routes(table)}) as server:
        origin = server.origins["cut"]
        run = courtly("crawl", origin + "/", "--db", tmp_path / "c.db", "--min-delay", "0",
                      "--config", conf, "--warc", warcs)
    assert run.status == 0, run.err
    files = sorted(warcs.glob("*.warc.gz"))
    warcio_check(*files)
    cut = {r["uri"].removeprefix(origin): r for f in files for r in records(f.read_bytes())
           if r["type"] == "response" and "WARC-Truncated" in r["warc"]}
    assert {path: r["warc"]["WARC-Truncated"] for path, r in cut.items()} == {
        "/huge": "length", "/dropped": "disconnect"}
    huge, dropped = cut["/huge"], cut["/dropped"]
    assert 90_000 <= len(huge["body"]) <= 100_000 and set(huge["body"]) == {ord("h")}
    assert dropped["body"] == b"<html>" + b"a" * 2000
    assert dropped["http"].get_header("X-Crawler-Content-Length") == "5000"
    assert dropped["http"].get_header("Content-Length") == "2006"
    requests = {r["warc"]["WARC-Concurrent-To"] for f in files for r in records(f.read_bytes())
                if r["type"] == "request"}
    assert {r["warc"]["WARC-Record-ID"] for r in cut.values()} <= requests
    indexed = {json.loads(line.split(" ", 2)[2])["url"]
               for line in (warcs / "index.cdxj").read_text().splitlines()}
    assert {origin + path for path in cut} <= indexed


def test_rolling_files_with_heritrix_names_and_a_cdxj_index(serve, db: Path,
                                                            tmp_path: Path) -> None:
    pages = {"/": Page(html("Home", [f"/p{i}" for i in range(30)]))}
    pages |= {f"/p{i}": Page(html(f"P{i}", [], body=random.Random(i).randbytes(1500).hex()))
              for i in range(30)}  # not compressible: about 3 kB a page in the file
    site = serve({"many": pages})
    assert courtly("crawl", site.url("many"), "--db", db, "--min-delay", "0").status == 0
    folder = tmp_path / "warcs"
    run = courtly("export", "--db", db, "--format", "warc", "--warc", folder,
                  "--warc-max-size", "20000")
    assert run.status == 0, run.err
    files = sorted(folder.glob("*.warc.gz"))
    assert len(files) >= 3 and not list(folder.glob("*.open"))
    name = re.compile(r"^courtly-\d{17}-(\d{5})-\d+~[^~]+\.warc\.gz$")
    serials = [int(name.match(f.name).group(1)) for f in files]  # type: ignore[union-attr]
    assert serials == list(range(len(files)))
    assert all(f.stat().st_size < 20000 + 10000 for f in files)  # rolled past the size
    warcio_check(*files)
    responses = [(f.name, r) for f in files for r in records(f.read_bytes())
                 if r["type"] == "response"]
    assert len(responses) == 31
    lines = (folder / "index.cdxj").read_text().splitlines()
    assert lines == sorted(lines) and len(lines) == 31
    indexed = {json.loads(line.split(" ", 2)[2])["url"]: json.loads(line.split(" ", 2)[2])
               for line in lines}
    for filename, response in responses:
        entry = indexed[response["uri"]]
        assert entry["filename"] == filename and entry["status"] == "200"
        assert entry["digest"] == response["warc"]["WARC-Payload-Digest"]


def test_pywb_replays_a_crawled_page_as_the_server_sent_it(serve, tmp_path: Path) -> None:
    """pywb (wb-manager add, then its wayback server on 127.0.0.1) replays the WARC files."""
    db = tmp_path / "crawl.db"
    body = html("Kept", ["/"], body="caf\u00e9 " * 100).encode()
    site = serve({"one": {"/": Page(html("Home", ["/kept"])), "/kept": Page(
        body, headers={"Content-Type": "text/html; charset=utf-8", "X-Odd-CASE": "yes"})}})
    assert courtly("crawl", site.url("one"), "--db", db, "--min-delay", "0").status == 0
    folder = tmp_path / "warcs"
    assert courtly("export", "--db", db, "--format", "warc", "--warc", folder).status == 0
    url = site.url("one", "/kept")
    stamp = rows(db, "SELECT fetched FROM content WHERE url = ?", url)[0]["fetched"]
    when = time.strftime("%Y%m%d%H%M%S", time.gmtime(stamp))
    with pywb(tmp_path / "pywb", sorted(folder.glob("*.warc.gz"))) as replay:
        status, headers, replayed = get(f"{replay}/crawl/{when}id_/{url}")
    assert status == 200 and replayed == body
    assert headers.get("X-Odd-CASE") == "yes"
    # the index beside the files is the one pywb made (pywb drops the digests' "sha1:")
    pywb_index = (tmp_path / "pywb/collections/crawl/indexes/index.cdxj").read_text()
    ours = (folder / "index.cdxj").read_text().replace('"sha1:', '"')
    assert sorted(pywb_index.splitlines()) == ours.splitlines()


@contextlib.contextmanager
def pywb(root: Path, warcs: list[Path]) -> Iterator[str]:
    """A pywb collection `crawl` of these files, served by `wayback` on 127.0.0.1."""
    tools = pywb_tools()
    root.mkdir()
    for command in (["init", "crawl"], ["add", "crawl", *map(str, warcs)]):
        done = subprocess.run([str(tools / "wb-manager"), *command], cwd=root,
                              capture_output=True, text=True, check=False, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([str(tools / "wayback"), "-b", "127.0.0.1", "-p", str(port)],
                              cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:  # until it listens (or has died)
            assert server.poll() is None, server.stderr.read()  # type: ignore[union-attr]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "wayback did not start in 60 s"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


def pywb_tools() -> Path:
    """Where pywb's commands are: its own environment beside the test venv (./dev makes it:
    pywb's dependency brotlipy would replace the brotli module courtly uses)."""
    tools = Path(sys.executable).parent.parent / "pywb" / "bin"
    assert (tools / "wayback").exists(), f"pywb is not installed in {tools.parent} (./dev test)"
    return tools


def get(url: str) -> tuple[int, Any, bytes]:
    """GET a URL on 127.0.0.1: status, headers, body."""
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.status, answer.headers, answer.read()


def written(folder: Path) -> dict[str, tuple[Any, ...]]:
    """The records of a directory's WARC files (warcinfo aside) by id: what identifies them."""
    out = {}
    for path in sorted(folder.glob("*.warc.gz")):
        for r in records(path.read_bytes()):
            if r["type"] != "warcinfo":
                http = r["http"].to_str() if r["http"] else None
                out[r["warc"]["WARC-Record-ID"]] = (r["type"], r["uri"], r["date"],
                                                    sorted(r["warc"].items()), http, r["body"])
    return out


def test_crawl_warc_writes_the_records_the_export_writes(serve, db: Path,
                                                          tmp_path: Path) -> None:
    same = html("Same", [], body="same words " * 40)
    site = serve({"one": {"/": Page(html("Home", ["/copy", "/same"])), "/copy": Page(same),
                          "/same": etag_page(same)}})
    live = tmp_path / "live"
    run = courtly("crawl", site.url("one"), "--db", db, "--min-delay", "0", "--warc", live)
    assert run.status == 0, run.err
    run = courtly("crawl", "--db", db, "--min-delay", "0", "--force-recrawl", "--warc", live)
    assert run.status == 0, run.err
    exported = tmp_path / "exported"
    assert courtly("export", "--db", db, "--format", "warc", "--warc", exported).status == 0
    during, after = written(live), written(exported)
    assert len(after) == 2 * (2 + 4)  # 2 pages, 4 revisits, their requests
    # the crawl's records and robots.txt's (the database keeps no exchange of it: not exported)
    assert {k: v for k, v in during.items() if k in after} == after
    assert {r[1].rpartition("/")[2] for k, r in during.items() if k not in after} == {
        "robots.txt"} and len(during) == len(after) + 2
    files = sorted(live.glob("*.warc.gz"))
    assert len(files) == 2  # one a crawl
    warcio_check(*files)
    lines = (live / "index.cdxj").read_text().splitlines()
    assert lines == sorted(lines) and len(lines) == 2 + 4 + 1
    assert {json.loads(line.split(" ", 2)[2])["filename"] for line in lines} == {
        f.name for f in files}


def test_crawl_warc_into_a_file_is_one_line(serve, tmp_path: Path) -> None:
    site = serve({"one": {"/": Page(html("Home", []))}})
    (tmp_path / "file").write_text("")
    run = courtly("crawl", site.url("one"), "--db", tmp_path / "c.db", "--warc",
                  tmp_path / "file" / "warcs")
    one_line(run, 2, "cannot create the WARC directory")


def test_export_warc_into_a_file_is_one_line_naming_the_directory(serve, tmp_path: Path
                                                                  ) -> None:
    """`export --warc file/warcs` said "cannot write standard output: Not a directory"."""
    db = tmp_path / "c.db"
    crawled(serve, db)
    (tmp_path / "file").write_text("")
    run = courtly("export", "--db", db, "--format", "warc", "--warc", tmp_path / "file" / "w")
    one_line(run, 2, f"cannot create the WARC directory {tmp_path}/file/w: Not a directory")
    assert "standard output" not in run.err and run.out == ""


def test_crawl_warc_without_kept_bodies_is_one_line(serve, tmp_path: Path) -> None:
    """`crawl --warc DIR` with `store_content = false` crawled everything, exit 0, and wrote no
    record (WARC records are read back from the kept pages): an empty directory."""
    site = serve({"one": {"/": Page(html("Home", []))}})
    conf = tmp_path / "crawl.toml"
    conf.write_text("store_content = false\n")
    run = courtly("crawl", site.url("one"), "--db", tmp_path / "c.db", "--config", conf,
                  "--warc", tmp_path / "w")
    one_line(run, 2, "crawl.toml: warc: ", "need store_content = true")
    assert site.hits == [] and not (tmp_path / "w").exists()


def test_a_file_left_open_by_a_killed_crawl_is_cut_named_and_indexed(serve,
                                                                       tmp_path: Path) -> None:
    """`kill -9` leaves a crawl's last file `.open`, its last record maybe cut, and in no index:
    pywb could not replay its pages. The next crawl with the directory cuts it after its last
    whole record, gives it its final name and indexes it; a live writer's file is left alone."""
    site = serve({"a": {"/": Page(html("A", ["/x"])), "/x": Page(html("X", []))},
                  "b": {"/": Page(html("B", []))}})
    warcs = tmp_path / "warcs"
    run = courtly("crawl", site.url("a"), "--db", tmp_path / "a.db", "--min-delay", "0",
                  "--warc", warcs)
    assert run.status == 0, run.err
    [done] = warcs.glob("*.warc.gz")
    body = done.read_bytes()
    done.unlink()
    (warcs / "index.cdxj").unlink()
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()  # a writer killed: no process has its id now
    host = socket.gethostname()
    left = warcs / f"courtly-20261127000000000-00000-{gone.pid}~{host}.warc.gz.open"
    left.write_bytes(body + body[: len(body) // 2])  # then a record cut by the kill
    live = warcs / f"courtly-20261127000000000-00001-{os.getpid()}~{host}.warc.gz.open"
    live.write_bytes(body)
    run = courtly("crawl", site.url("b"), "--db", tmp_path / "b.db", "--min-delay", "0",
                  "--warc", warcs)
    assert run.status == 0, run.err
    recovered = warcs / left.name.removesuffix(".open")
    assert not left.exists() and recovered.exists() and live.read_bytes() == body
    size = len(recovered.read_bytes())
    assert len(body) <= size < len(body) + len(body) // 2  # the cut record is gone
    warcio_check(recovered)
    lines = (warcs / "index.cdxj").read_text().splitlines()
    indexed = {(json.loads(line.split(" ", 2)[2])["url"],
                json.loads(line.split(" ", 2)[2])["filename"]) for line in lines}
    assert {(site.url("a"), recovered.name), (site.url("a", "/x"), recovered.name)} <= indexed
    assert any(url == site.url("b") for url, _ in indexed)


def test_the_writer_of_a_warc_file_is_read_from_its_name() -> None:
    """A host name with '-' (most have one) once hid the process id: no leftover was recovered."""
    assert writer_of("courtly-20261127000000000-00003-4321~web-01.example.warc.gz.open") == (
        4321, "web-01.example")
    assert writer_of("my-prefix-20261127000000000-00000-17~vm.warc.gz") == (17, "vm")
    assert writer_of("notes.warc.gz.open")[0] is None  # not one of ours: left alone


def test_crawl_warc_holds_every_response_and_pywb_follows_a_redirect(serve,
                                                                      tmp_path: Path) -> None:
    """`crawl --warc` archived the 200 pages alone: a redirect, a 404 or 410 page, a 500, a
    file and robots.txt were in no record, so a replayed link to a moved page led nowhere.
    Now each response is a response record with its request, as Heritrix writes them."""
    missing, new = html("Not here", [], body="sorry, nothing"), html("New", [], body="moved")
    site = serve({"one": {
        "/": Page(html("Home", ["/old", "/missing", "/gone", "/broken", "/data.txt"])),
        "/old": Page("moved", 301, {"Location": "/new", "Content-Type": "text/plain"}),
        "/new": Page(new),
        "/missing": Page(missing, 404), "/gone": Page("gone", 410, {"Content-Type": "text/plain"}),
        "/broken": Page("oops", 500, {"Content-Type": "text/plain"}),
        "/data.txt": Page("plain", headers={"Content-Type": "text/plain"})}})
    db, warcs = tmp_path / "crawl.db", tmp_path / "warcs"
    run = courtly("crawl", site.url("one"), "--db", db, "--min-delay", "0", "--warc", warcs)
    assert run.status == 0, run.err
    files = sorted(warcs.glob("*.warc.gz"))
    warcio_check(*files)
    found = [r for f in files for r in records(f.read_bytes())]
    responses = {r["uri"]: r for r in found if r["type"] == "response"}
    statuses = {url.removeprefix(site.origins["one"]): int(r["http"].get_statuscode())
                for url, r in responses.items()}
    assert statuses == {"/": 200, "/new": 200, "/old": 301, "/missing": 404, "/gone": 410,
                        "/broken": 500, "/data.txt": 200, "/robots.txt": 404}
    page = responses[site.url("one", "/missing")]
    assert page["body"] == missing.encode() and "WARC-Payload-Digest" in page["warc"]
    fetched = rows(db, "SELECT started FROM crawl_log WHERE url = ? AND http_status = 404",
                   site.url("one", "/missing"))[0]["started"]
    assert page["warc"]["WARC-Date"] == warc_date(fetched)
    requests = {r["warc"]["WARC-Concurrent-To"]: r for r in found if r["type"] == "request"}
    for url, response in responses.items():  # each with the request that asked for it
        request = requests[response["warc"]["WARC-Record-ID"]]
        assert request["uri"] == url and request["date"] == response["date"]
        assert request["http"].protocol == "GET"
    lines = (warcs / "index.cdxj").read_text().splitlines()
    assert len(lines) == len(responses) and lines == sorted(lines)
    old = site.url("one", "/old")
    when = time.strftime("%Y%m%d%H%M%S", time.gmtime(
        rows(db, "SELECT started FROM crawl_log WHERE url = ?", old)[0]["started"]))
    with pywb(tmp_path / "pywb", files) as replay:
        # the old URL replayed (its links rewritten: mp_) is redirected to the new one's capture
        with urllib.request.urlopen(f"{replay}/crawl/{when}mp_/{old}", timeout=30) as answer:
            landed, replayed = answer.geturl(), answer.read()
        with pytest.raises(urllib.error.HTTPError) as refused:
            get(f"{replay}/crawl/{when}id_/{site.url('one', '/missing')}")
        assert refused.value.code == 404 and refused.value.read() == missing.encode()
    assert landed.endswith("mp_/" + site.url("one", "/new")) and b"moved" in replayed
