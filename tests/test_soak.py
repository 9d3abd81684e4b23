"""Crash safety under repeated kills, and bounded memory on huge pages (real subprocesses)."""

from __future__ import annotations

import gzip
import json
import random
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from courtly.site import Page
from tests.conftest import courtly_process, fetched_paths, rows
from tests.hostile_server import HostileServer, endless, page, routes

ORIGINS = ("a", "b", "c")
PAGES = 120  # enough that twenty kills at random moments come before the end, on a fast machine
KILLS = 20


def words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=6)) for _ in range(n))


def soak_site(name: str, rng: random.Random) -> dict[str, Page]:
    def body(title: str, links: list[str]) -> str:
        anchors = "".join(f'<a href="{h}">{h}</a> ' for h in links)
        return f"<html><head><title>{title}</title></head><body><p>{words(rng, 40)}</p>" \
               f"{anchors}</body></html>"

    pages = {"/": Page(body(f"{name} home", [f"/p{i}" for i in range(0, PAGES, 6)]))}
    for i in range(PAGES):
        links = ["/", f"/p{(i + 1) % PAGES}", f"/p{(i * 7 + 3) % PAGES}"]
        pages[f"/p{i}"] = Page(body(f"{name} {i}", links), delay=0.005)
    return pages


def actions(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        return len(rows(db, "SELECT id FROM crawl_log"))
    except sqlite3.Error:  # the schema may not exist yet
        return 0


def wait_for(db: Path, n: int, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if actions(db) >= n:
            return
        time.sleep(0.01)


@pytest.mark.slow
def test_twenty_kill_9_at_random_moments_then_everything_once(serve: Any, db: Path,
                                                               tmp_path: Path) -> None:
    rng = random.Random(8)
    site = serve({name: soak_site(name, rng) for name in ORIGINS})
    seeds = [site.url(name) for name in ORIGINS]
    config = tmp_path / "soak.toml"
    # group commit on, with a small window (20 ms): each kill loses at most that window
    config.write_text("min_delay = 0.01\nprogress = \"off\"\ncommit_interval = 0.02\n"
                      "[dedup]\nnear = false\n")
    args = ["crawl", *seeds, "--db", db, "--config", config]
    started = time.monotonic()
    killed_while_running = 0
    for _ in range(KILLS):
        proc = courtly_process(*args)
        more = rng.choice([0, 0, 1, 2, 3, 5, 8, 13])
        if more == 0:  # start-up: opening, migrating, adding seeds, fetching robots.txt
            time.sleep(rng.uniform(0.05, 0.8))
        else:
            wait_for(db, actions(db) + more, proc)
            time.sleep(rng.uniform(0, 0.02))
        killed_while_running += proc.poll() is None
        proc.kill()
        proc.communicate(timeout=10)
    assert killed_while_running >= KILLS - 2, "the crawl finished before the kills were done"
    total = PAGES + 1
    assert actions(db) < len(ORIGINS) * total, "the kills came too late to test anything"

    final = courtly_process(*args)
    _, err = final.communicate(timeout=60)
    soak_time = time.monotonic() - started
    assert final.returncode == 0, err
    assert "Traceback" not in err

    # every page has exactly one completed crawl action, nothing is missing
    log = rows(db, "SELECT url, exit_code FROM crawl_log")
    completed = Counter(r["url"] for r in log if r["exit_code"] == "OK")
    assert len(completed) == len(ORIGINS) * total
    assert set(completed.values()) == {1}, [u for u, n in completed.items() if n > 1]
    assert {r["exit_code"] for r in log} == {"OK"}
    assert {r["state"] for r in rows(db, "SELECT state FROM candidates")} == {"CRAWLED"}
    # on the wire: only the requests in flight at a kill, or in its uncommitted 20 ms window
    # (a request takes ≥ 15 ms: at most 2 per origin), were sent twice
    for name in ORIGINS:
        paths = Counter(fetched_paths(site, name))
        assert len(paths) == total
        assert sum(n - 1 for n in paths.values()) <= KILLS * 3
    assert rows(db, "PRAGMA integrity_check")[0]["integrity_check"] == "ok"
    print(f"soak: {KILLS} kills, {soak_time:.1f}s")
    assert soak_time < 100


# -- memory ---------------------------------------------------------------------------------
#: runs the courtly command, then prints its exit status and the peak RSS of it and of its page
#: worker (VmHWM: the high-water mark of each process image, read from /proc; the worker's is read
#: every 20 ms while it runs, the mark only grows, so the last read holds its peak until then)
_MEASURE = """
import glob, json, sys, threading, time
from courtly.cli import main

def hwm(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0

workers = {}
def watch():
    while True:
        for path in glob.glob("/proc/self/task/*/children"):
            for pid in open(path).read().split():
                workers[pid] = max(workers.get(pid, 0), hwm(pid))
        time.sleep(0.02)

threading.Thread(target=watch, daemon=True).start()
try:
    main(sys.argv[1:])
except SystemExit as exc:
    status = exc.code
print(json.dumps({"status": status, "peak_rss_mb": hwm("self") / 1024,
                  "worker_rss_mb": max(workers.values(), default=0) / 1024}))
"""


def test_peak_memory_stays_bounded_on_huge_pages(db: Path) -> None:
    """100k links on one page, a 200 MB body and a 200 MB gzip bomb: peak RSS under 300 MB."""
    links = "".join(f'<a href="/p{i}">page number {i}</a>\n' for i in range(100_000)).encode()
    pages = {
        "/": page(b"<html><body>" + links),  # 4 MB, 100,000 links
        "/robots.txt": page("User-agent: *\nDisallow: /p\n", "text/plain"),
    }
    bomb_html = gzip.compress(b"<html><body>" + b"<a href='/x'>x</a>" * (12 << 20))
    with HostileServer({
        "links": routes(pages),
        "huge": endless(chunked=False, declared=None, total=200 << 20),
        "bomb": routes({"/": page(bomb_html, Content_Encoding="gzip")}),
    }) as srv:
        proc = subprocess.run(
            [sys.executable, "-c", _MEASURE, "crawl", *(srv.url(n) for n in srv.origins),
             "--db", str(db), "--min-delay", "0", "--progress", "off"],
            capture_output=True, text=True, timeout=120,
        )
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["status"] == 0, proc.stderr
        codes = {r["url"]: r["exit_code"] for r in rows(db, "SELECT url, exit_code FROM "
                                                            "candidates")}
        assert codes[srv.url("links")] == "OK"
        assert codes[srv.url("huge")] == "TOO_LARGE"
        assert codes[srv.url("bomb")] == "TOO_LARGE"
        # links taken: the default limit, all of them recorded (robots.txt refuses them)
        assert sum(1 for u in codes if u.startswith(srv.url("links", "/p"))) == 5000
    print(f"peak RSS: {result['peak_rss_mb']:.0f} MB, page worker {result['worker_rss_mb']:.0f} MB")
    assert result["peak_rss_mb"] < 300
    assert 10 < result["worker_rss_mb"] < 300  # it ran (a Python process), and stayed bounded
