"""The hostile web: 35 origins that fight back, crawled with the defaults, timed and measured.

    .venv/bin/python bench/hostile_web.py [--min-delay 0.05] [--concurrency 8]

Each origin is one port on 127.0.0.1 (tests/hostile_server.py) with one kind of trouble: traps
(a calendar, fresh session ids, repeated segments, an endless redirect chain), hangs (no byte,
a stalled body, a trickling body, headers at one byte a second), storms of 500s and resets,
bombs (gzip, endless bodies, header floods), broken encodings and statuses, broken robots.txt
(garbage, 500, a redirect loop, redirects to another origin's robots.txt), and a few healthy
origins beside them. The crawl runs with the default configuration but for the two flags, and
the benchmark reports: the wall time (issue 26's target: it ends by itself within 4 minutes),
the peak RSS of the crawl and of its page worker (≤ 512 MB), the requests each origin saw, and
whether every URL the database knows was given an exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from tests.hostile_server import (  # noqa: E402  (after the path set-up)
    Conn,
    HostileServer,
    Request,
    calendar,
    close_at_once,
    drip,
    endless,
    fixed,
    gzip_bomb,
    header_flood,
    link_page,
    page,
    redirect_forever,
    repeating_paths,
    reset_mid_body,
    response,
    routes,
    serves_robots,
    session_ids,
    silent,
    stall_after_headers,
)

#: the crawl's own peak RSS and its page worker's (see tests/test_soak.py)
MEASURE = (ROOT / "tests" / "test_soak.py").read_text().split('_MEASURE = """', 1)[1]
MEASURE = MEASURE.split('"""', 1)[0]


async def storm_500(conn: Conn, req: Request) -> None:
    if req.path == "/":
        await conn.send(link_page([f"/p{i}" for i in range(200)]))
    else:
        await conn.send(page("oops", "text/plain", "500 Internal Server Error"))


async def all_500(conn: Conn, req: Request) -> None:
    await conn.send(page("down", "text/plain", "500 Internal Server Error"))


async def slow_headers(conn: Conn, req: Request) -> None:
    """The status line and headers at one byte a second."""
    for byte in response("200 OK", {"Content-Type": "text/html", "Content-Length": "2"}, b"ok"):
        await conn.send(bytes([byte]))
        await asyncio.sleep(1.0)


def hangs(fault: Any) -> Any:
    """A home page linking ten URLs that each hang the same way."""
    return routes({"/": link_page([f"/h{i}" for i in range(10)])}, fault)


def healthy(pages: int) -> Any:
    table: dict[str, bytes | Any] = {"/": link_page([f"/p{i}" for i in range(pages)])}
    for i in range(pages):
        table[f"/p{i}"] = link_page([f"/p{(i + 1) % pages}"], f"page {i} " * 40)
    return routes(table)


def faults(port_of: dict[str, int]) -> dict[str, Any]:
    """The 35 origins; port_of is filled in once the servers listen (robots redirects)."""

    def robots_to(name: str) -> Any:
        async def fault(conn: Conn, req: Request) -> None:
            if req.path == "/robots.txt":
                target = f"http://127.0.0.1:{port_of[name]}/robots.txt"
                await conn.send(response("301 Moved", {"Location": target,
                                                       "Content-Length": "0"}))
            else:
                await conn.send(link_page(["/x", "/y"]))
        return serves_robots(fault)

    robots_table = {"/robots.txt": page("User-agent: *\nCrawl-delay: 1\n", "text/plain")}
    return {
        # traps
        "calendar": calendar, "session-ids": session_ids, "repeating": repeating_paths,
        "redirect-chain": redirect_forever,
        "redirect-loop": routes({"/": page("", status="301 Moved", Location="/b"),
                                 "/b": page("", status="302 Found", Location="/")}),
        # hangs
        "silent": hangs(silent), "stall": hangs(stall_after_headers()),
        "drip": hangs(drip(0.5)), "slow-headers": hangs(slow_headers),
        # failing servers
        "storm-500": storm_500, "all-500": all_500,
        "resets": hangs(reset_mid_body), "closes": hangs(close_at_once),
        # bombs
        "gzip-bomb": fixed(page(gzip_bomb(64 << 20), Content_Encoding="gzip")),
        "endless": endless(), "declared-200mb": endless(chunked=False, declared=200_000_000),
        "header-flood": fixed(header_flood(5000)),
        "many-links": serves_robots(routes(  # 20,000 links, all disallowed
            {"/robots.txt": page("User-agent: *\nDisallow: /p\n", "text/plain"),
             "/": link_page([f"/p{i}" for i in range(20_000)])}, fixed(link_page([])))),
        # broken encodings and statuses
        "bad-status": fixed(b"HTTP/1.1 2OO OK\r\n\r\n"),
        "bad-chunks": fixed(response("200 OK", {"Transfer-Encoding": "chunked",
                                                "Content-Type": "text/html"}, b"5\r\nabc")),
        "short-body": fixed(response("200 OK", {"Content-Length": "999"}, b"<html>")),
        "bad-gzip": fixed(page(b"\x1f\x8bnot really gzip", Content_Encoding="gzip")),
        "bogus-charset": fixed(page(b"<a href='/c'>\xff\xfe</a>", "text/html; charset=nope")),
        "deep-html": fixed(page(b"<html><body>" + b"<div>" * 150_000 + b"</body>")),
        # broken robots.txt
        "robots-garbage": serves_robots(routes({"/robots.txt": page(os.urandom(3000),
                                                                     "text/plain")},
                                               fixed(link_page([])))),
        "robots-500": serves_robots(routes({"/robots.txt": page("", "text/plain",
                                                                "500 Oops")},
                                           fixed(link_page([])))),
        "robots-loop": serves_robots(routes({"/robots.txt": page(
            "", "text/plain", "301 Moved", Location="/robots.txt")}, fixed(link_page([])))),
        "robots-target": serves_robots(routes(robots_table, healthy(20))),
        **{f"robots-to-{i}": robots_to("robots-target") for i in range(4)},
        # healthy neighbours
        **{f"healthy-{i}": healthy(30) for i in range(3)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-delay", default="0.05")
    parser.add_argument("--concurrency", default="8")
    args = parser.parse_args()
    port_of: dict[str, int] = {}
    table = faults(port_of)
    with HostileServer(table) as server, tempfile.TemporaryDirectory() as tmp:
        port_of.update({n: int(o.rsplit(":", 1)[1]) for n, o in server.origins.items()})
        db = Path(tmp) / "hostile.db"
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-c", MEASURE, "crawl", *(server.url(n) for n in table),
             "--db", str(db), "--min-delay", args.min_delay, "--concurrency", args.concurrency,
             "--progress", "off"],
            capture_output=True, text=True, timeout=1800,
            env=os.environ | {"PYTHONPATH": str(ROOT / "src")},
        )
        took = time.monotonic() - started
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        with sqlite3.connect(db) as conn:
            states = Counter(s for (s,) in conn.execute("SELECT state FROM candidates"))
            codes = Counter(c for (c,) in conn.execute("SELECT exit_code FROM crawl_log"))
            unfinished = conn.execute(
                "SELECT COUNT(*) FROM candidates WHERE exit_code IS NULL").fetchone()[0]
        hits = Counter(h.origin for h in server.hits)
        by_name = {n: hits[o] for n, o in server.origins.items()}
    print(f"origins {len(table)}, wall {took:.1f}s, exit status {result['status']}, "
          f"peak RSS {result['peak_rss_mb']:.0f} MB (page worker {result['worker_rss_mb']:.0f} MB)")
    print(f"candidates {sum(states.values())} by state {dict(states)}; without an exit code: "
          f"{unfinished}")
    print(f"crawl actions by exit code: {dict(codes.most_common())}")
    print("requests by origin: " + ", ".join(f"{n} {c}" for n, c in sorted(by_name.items())))
    print("last lines: " + " | ".join(proc.stderr.strip().splitlines()[-3:]))


if __name__ == "__main__":
    main()
