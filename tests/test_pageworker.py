"""The page worker: the same analysis in a worker process as inline, and a worker's death."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import zstandard

from courtly.analysis import (
    STORED_EXCHANGE,
    PageAnalysis,
    PageSettings,
    analyse_page,
    compress_exchange,
)
from courtly.config import Normalize
from courtly.pageworker import PageWorker, TooComplex
from courtly.parse import link_canonical, parse_html, refresh
from courtly.site import Page, html
from courtly.urls import Rules
from tests.conftest import candidates, courtly, rows

URL = "http://127.0.0.1:8000/dir/page.html"
TEXT = " ".join(f"word{i}" for i in range(60))
PAGES = [
    html("Links", ["a.html", "./a.html#x", "../b?z=1&a=2", "/dir/page.html", "mailto:x@y.z",
                   "http://other.example/"], f"<p>{TEXT}</p>"),
    html("Nofollow", ["/x"], '<meta name="robots" content="nofollow">'),
    html("Noindex", ["/y"], f'<meta name="robots" content="noindex"><p>{TEXT}</p>'),
    html("Canonical", ["/z"], '<link rel="canonical" href="/other">'),
    html("Self canonical", ["/z"], '<link rel="canonical" href="page.html">'),
    html("Base", ["c.html"], '<base href="http://127.0.0.1:8000/elsewhere/">'),
    "<a href=/r rel=nofollow>skipped</a><a href=/k>kept</a>",
]


def settings(near: bool = True) -> PageSettings:
    return PageSettings("courtly", 5000, 4 * 1024 * 1024, near, 50, Rules.of(Normalize()),
                        compress=True)


def test_analyse_page_resolves_filters_and_fingerprints() -> None:
    page = analyse_page(settings(), URL, PAGES[0].encode(), "text/html", "")
    assert page.title == "Links"
    assert [url for url, _ in page.links] == [
        "http://127.0.0.1:8000/dir/a.html", "http://127.0.0.1:8000/b?a=2&z=1",
        "http://other.example/",  # out of scope: the crawler's policy drops it
    ]
    assert page.near_signature is not None and not page.noindex and page.canonical is None
    assert page.content is not None
    assert zstandard.ZstdDecompressor().decompress(page.content) == PAGES[0].encode()

    nofollow = analyse_page(settings(), URL, PAGES[1].encode(), None, "")
    assert nofollow.nofollow and nofollow.links == []
    header = analyse_page(settings(), URL, PAGES[0].encode(), None, "courtly: noindex")
    assert header.noindex and header.near_signature is None  # no near-duplicate check then
    assert header.content is None  # nor stored content
    canonical = analyse_page(settings(), URL, PAGES[3].encode(), None, "")
    assert canonical.canonical == "http://127.0.0.1:8000/other" and canonical.links == []
    assert analyse_page(settings(), URL, PAGES[4].encode(), None, "").canonical is None
    base = analyse_page(settings(), URL, PAGES[5].encode(), None, "")
    assert base.links == [("http://127.0.0.1:8000/elsewhere/c.html", "c.html")]
    rel = analyse_page(settings(near=False), URL, PAGES[6].encode(), None, "")
    assert rel.links == [("http://127.0.0.1:8000/k", "kept")] and rel.near_signature is None


def test_a_refresh_and_a_link_header_are_read_as_browsers_and_rfc_8288_read_them() -> None:
    """The WHATWG shared declarative refresh steps (a refresh's delay and URL; None: none), and
    a Link header's first rel=canonical target; neither raises, nor takes quadratic time."""
    refreshes = {
        "0; url=/a": (0, "/a"), "0;URL='/a' junk": (0, "/a"), '0 ; url = "/a': (0, "/a"),
        "3, /a": (3, "/a"), "0 /a": (0, "/a"), "1.5.9;url=/a": (1, "/a"), ".5;/a": (0, "/a"),
        "0;urn:x": (0, "urn:x"), "0; url /a": (0, "url /a"), "0;url=": (0, ""), "5": (5, None),
        "5; ": (5, None), "": None, "x; url=/a": None, "0x": None, "9" * 5000: (10**9, None),
    }
    assert {value: refresh(value) for value in refreshes} == refreshes
    links = {
        '</a>; rel="canonical"': "/a", "</a>; REL=Canonical": "/a",
        '<http://x/p,q>; rel=preload, </a>; rel="alternate canonical"': "/a",
        '</t>; title="x, </b>; rel=canonical"; rel=canonical': "/t",
        "</a>; rel=next; rel=canonical": None, "</a>; rel=canonicals": None, "garbage": None,
        "<" * 200_000 + ">; rel=canonical": "",
    }
    assert {value[:80]: link_canonical(value) for value in links} == {
        value[:80]: target for value, target in links.items()}


def test_an_exchange_is_one_zstd_frame_compressed_only_when_large() -> None:
    unpack = zstandard.ZstdDecompressor()
    for size in (0, 1, 255, 256, STORED_EXCHANGE, STORED_EXCHANGE + 1, 70_000):
        exchange = (b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\nHTTP/1.1 200 OK\r\n" * size)[:size]
        frame = compress_exchange(exchange)
        assert unpack.decompress(frame) == exchange  # what warc.Archive reads
        assert zstandard.frame_content_size(frame) == size
        assert (len(frame) < size) == (size > STORED_EXCHANGE)  # the small ones as they are
    page = analyse_page(settings(), URL, PAGES[0].encode(), "text/html", "", b"GET /\r\n\r\n")
    assert page.exchange is not None and unpack.decompress(page.exchange) == b"GET /\r\n\r\n"


def test_parse_reads_links_in_document_order_and_the_first_title() -> None:
    page = parse_html(
        b"<a href=/a>A</a><title> First </title><area href=/b rel='NoFollow ugc'>"
        b"<a href=/c rel=''>C</a><a href=/d rel=nofollowed>D</a><a href=/e REL=' NOFOLLOW '>E</a>"
        b"<svg><title>svg</title></svg><title>second</title><a href='/f' rel>F</a>",
        None, "courtly", 10,
    )
    assert page.title == "First"
    assert page.links == [("/a", "A", False), ("/b", "", True), ("/c", "C", False),
                          ("/d", "D", False), ("/e", "E", True), ("/f", "F", False)]
    assert parse_html(b"<svg><title>s</title></svg><title>t</title>", None, "c", 1).title == "s"


def test_parse_reads_only_elements_with_the_attributes_it_needs() -> None:
    page = parse_html(
        b"<base target=_top><base href=' /b/ '><base href=/ignored/>"
        b"<link rel=canonical><link href=/x><link rel='Canonical' href=' /canon '>"
        b"<meta name=robots><meta content=noindex><meta name=ROBOTS content=nofollow>"
        b"<a name=top>no href</a><a href>empty</a><a href=/1>1</a><a href=/2>2</a><a href=/3>3</a>",
        None, "courtly", 3,
    )
    assert (page.base, page.canonical) == ("/b/", "/canon")
    assert (page.noindex, page.nofollow) == (False, True)
    assert page.links == [("", "empty", False), ("/1", "1", False), ("/2", "2", False)]


def test_the_main_content_is_the_first_main_or_every_article() -> None:
    """What parse_html's one walk of the tree finds, main_text reads (document order)."""
    def text(body: bytes) -> str | None:
        return parse_html(body, None, "c", 5, want_text=True).text

    assert text(b"<nav>n</nav><main>m1</main><main>m2</main><article>a</article>") == "m1"
    assert text(b"<article>one</article><p>x</p><article>two</article>") == "one two"
    assert text(b"<nav>n</nav><div role=main>r</div>") == "r"
    assert text(b"<nav>n</nav><p>body</p><footer>f</footer>") == "body"
    # an SVG link named canonical is a link, not the page's canonical URL
    page = parse_html(b"<svg><a rel=canonical href=/s>s</a></svg>", None, "c", 5)
    assert page.canonical is None and page.links == [("/s", "s", False)]


def test_anchor_texts_are_read_only_when_wanted() -> None:
    body = b"<title>T</title><a href=/a>A</a><a href=/b rel=nofollow><b>B</b></a>"
    assert parse_html(body, None, "c", 10, want_anchors=False).links == [
        ("/a", "", False), ("/b", "", True)]
    assert parse_html(body, None, "c", 10).links == [("/a", "A", False), ("/b", "B", True)]


async def _analyse_all(worker: PageWorker) -> list[PageAnalysis]:
    return list(await asyncio.gather(
        *(worker.analyse(URL, page.encode(), "text/html", "") for page in PAGES * 5)
    ))


def test_worker_process_gives_the_inline_analysis() -> None:
    inline = asyncio.run(_analyse_all(PageWorker(settings(), 0)))

    async def in_worker() -> tuple[list[PageAnalysis], int | None]:
        worker = PageWorker(settings(), 1)
        try:
            results = await _analyse_all(worker)
            conn = worker._conn
            assert conn is not None and conn.proc.poll() is None
            proc = conn.proc
        finally:
            worker.close()
        return results, proc.poll()

    results, status = asyncio.run(in_worker())
    assert results == inline
    assert status is not None  # closing reaps the worker


def test_a_killed_worker_is_replaced_and_its_pages_are_analysed_inline() -> None:
    expected = analyse_page(settings(), URL, PAGES[0].encode(), "text/html", "")

    async def run() -> None:
        worker = PageWorker(settings(), 1)
        try:
            for _ in range(3):
                assert await worker.analyse(URL, PAGES[0].encode(), "text/html", "") == expected
                conn = worker._conn
                assert conn is not None
                conn.proc.kill()
                # pages in flight when it dies, and after, still get their analysis
                results = await asyncio.gather(
                    *(worker.analyse(URL, PAGES[0].encode(), "text/html", "") for _ in range(5))
                )
                assert results == [expected] * 5
                assert conn.proc.poll() is not None  # reaped
            assert worker.restarts == 3
        finally:
            worker.close()

    asyncio.run(run())


#: markup whose end tags lexbor ignores: each <x> nests in the last, a quadratic parse that the
#: nesting guard's model does not see (about 3 s here; docs/reliability.md)
SLOW = b"<html><body>" + b"<x></y>" * 60_000


def test_a_worker_too_long_on_a_page_is_replaced_and_the_others_are_answered() -> None:
    """Past max_seconds on one page the worker is killed: that page is TooComplex, the pages
    queued behind it are answered by the next worker (not analysed inline, where a second slow
    page would stall the crawl), and no restart is counted against the worker."""
    expected = analyse_page(settings(), URL, PAGES[0].encode(), "text/html", "")

    async def run() -> None:
        worker = PageWorker(settings(), 1, max_seconds=0.3)
        try:
            await worker.analyse(URL, PAGES[0].encode(), "text/html", "")  # started
            first = worker._conn
            assert first is not None
            started = time.monotonic()
            slow = worker.send(URL, SLOW, "text/html", "")
            queued = [worker.send(URL, PAGES[0].encode(), "text/html", "") for _ in range(3)]
            assert slow is not None and all(page is not None for page in queued)
            with pytest.raises(TooComplex):
                await worker.result(slow)
            answers = [await worker.result(page) for page in queued if page is not None]
            assert answers == [expected] * 3
            assert time.monotonic() - started < 2.0  # not the parse's 3 s
            assert first.proc.poll() is not None and worker._conn is not first
            assert worker.restarts == 0 and worker.workers == 1
            assert await worker.analyse(URL, PAGES[0].encode(), "text/html", "") == expected
        finally:
            worker.close()

    asyncio.run(run())


def test_the_worker_exits_when_the_crawler_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import asyncio, sys, time
        sys.path[:0] = {sys.path!r}
        from courtly.analysis import PageSettings
        from courtly.config import Normalize
        from courtly.pageworker import PageWorker
        from courtly.urls import Rules

        async def main():
            worker = PageWorker(PageSettings("courtly", 10, 1000, True, 50,
                                             Rules.of(Normalize()), False), 1)
            await worker.analyse("http://a.test/", b"<a href=x>x</a>", None, "")
            print(worker._conn.proc.pid, flush=True)
            time.sleep(60)

        asyncio.run(main())
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return  # it exited (and init reaped it)
        if _zombie(child):
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the page worker outlived the crawler")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return False


def test_a_crawl_gives_the_same_results_with_and_without_worker(serve, tmp_path: Path) -> None:
    site = serve({"one": {
        "/": Page(html("Home", ["/a", "/b#f", "/c?b=2&a=1", "/nf", "/hidden", "/print"])),
        "/a": Page(html("A", ["/", "b", "/deep/1"], f"<p>{TEXT}</p>")),
        "/b": Page(html("B", ["/a"], f"<p>{TEXT}</p>")),  # a near duplicate of /a
        "/c?a=1&b=2": Page(html("C", ["/a"])),
        "/deep/1": Page(html("Deep", ["../a", "2"])),
        "/deep/2": Page(html("Deep 2", [])),
        "/nf": Page(html("NF", ["/nf-child"], '<meta name="robots" content="nofollow">')),
        "/hidden": Page(html("Hidden", ["/from-hidden"], '<meta name="robots" content="noindex">')),
        "/from-hidden": Page(html("From hidden", [])),
        "/print": Page(html("Print", ["/print-only"], '<link rel="canonical" href="/a">')),
    }})
    one = site.origins["one"]
    results = []
    for workers in (0, 1):
        config = tmp_path / f"w{workers}.toml"
        config.write_text(f"parse_workers = {workers}\n")
        db = tmp_path / f"w{workers}.db"
        run = courtly("crawl", one + "/", "--db", db, "--min-delay", "0", "--config", config)
        assert run.status == 0, run.err
        assert "Traceback" not in run.err and "page worker" not in run.err
        codes = {url: c["exit_code"] for url, c in candidates(db).items()}
        details = rows(db, "SELECT url, exit_code, detail FROM crawl_log ORDER BY url")
        results.append((codes, details))
    assert results[0] == results[1]
    codes = results[1][0]
    assert codes[one + "/b"] == "DUPLICATE_CONTENT" and codes[one + "/print"] == "NOT_CANONICAL"
    assert one + "/nf-child" not in codes and one + "/deep/2" in codes


def test_the_crawl_process_loads_no_page_analysis_or_other_backend_libraries() -> None:
    """NumPy (MinHash, in the page worker), psycopg (PostgreSQL) and aiohttp (the demo site)
    cost a SQLite crawl's process start 1.3 billion instructions when imported: not loaded."""
    code = ("import sys, courtly.cli, courtly.crawler, courtly.store.sqlite, courtly.pageworker; "
            "print(sorted({m.split('.')[0] for m in sys.modules} "
            "& {'numpy', 'psycopg', 'aiohttp'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_page_worker_loads_neither_the_configuration_nor_asyncio() -> None:
    """The worker process imports `analysis` and unpickles plain settings: pydantic, the
    configuration and asyncio cost its every start a tenth of a second of CPU."""
    code = ("import pickle, sys, courtly.analysis as a; s = pickle.loads(sys.stdin.buffer.read()); "
            "page = a.analyse_page(s, 'http://a.test/x/', b'<base href=/y/><a href=b>b</a>', "
            "'text/html', ''); print(page.links[0][0], sorted({m.split('.')[0] for m in "
            "sys.modules} & {'pydantic', 'asyncio'}), 'courtly.config' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(settings()),
                         capture_output=True, check=True)
    assert out.stdout.decode().split() == ["http://a.test/y/b", "[]", "False"]


def test_a_crawl_without_serve_loads_neither_the_view_nor_aiohttp(serve, tmp_path: Path) -> None:
    """The live view's server (aiohttp, prometheus_client) is loaded for --serve only: it cost
    every crawl's start 0.2 s of CPU and 10 MB."""
    site = serve({"one": {"/": Page(html("Home", ["/a"])), "/a": Page(html("A", []))}})
    code = textwrap.dedent("""
        import atexit, sys
        from courtly.cli import main
        loaded = lambda: {m.split(".")[0] for m in sys.modules} | set(sys.modules)
        atexit.register(lambda: print(sorted(loaded() & {
            "aiohttp", "prometheus_client", "numpy", "courtly.view.server"})))
        main()
    """)
    args = ["crawl", site.origins["one"] + "/", "--db", str(tmp_path / "c.db"), "--min-delay", "0"]
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert len(rows(tmp_path / "c.db", "SELECT url FROM crawl_log WHERE http_status = 200")) == 2
