"""Frontier scale (issue 6): the crawl database as the frontier at 100k, 1M and 10M known URLs.

For each size N it builds a SQLite crawl database with N candidates spread over 1,000 origins
(10% already crawled), then measures:

- fill todo: mean time of `Store.take_todo(origin, run, 64, now)` over 200 origins;
- link insert: throughput of inserting 20k new links and re-inserting 20k known ones (the same
  number at every size, spread over the whole table; 30 links per transaction, as a crawled page
  does, each committed), and of 100k more new links with the crawler's group commit
  (`commit_interval`, 2 s by default) as five groups of 20k, each one commit: sustained, so that
  the checkpoints SQLite runs every 10,000 log pages fall inside the measurement at every size
  (one group alone measured whether a checkpoint happened to fall in it); and of 20k other known
  links with group commit (one group: how a crawl re-inserts them);
- resume: time from starting `courtly crawl --db DB` to the first request the local server sees
  (the database's origins include live 127.0.0.1 origins);
- peak RSS of that `courtly crawl` (VmHWM), which runs 300 crawl actions.

The store measurements are repeated on fresh copies (--repeat, 3 by default) and the table shows
their medians: on these VMs one measurement of the same database moves by up to half.

Usage: .venv/bin/python bench/frontier_bench.py [--sizes 100000 1000000 10000000] [--repeat 3]
                                                [--cold]
Databases are cached in bench/.cache/frontier/ (a 10M database takes a few minutes to build).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from courtly.config import CrawlConfig
from courtly.model import Link
from courtly.site import LocalSite, Page, html
from courtly.store.sqlite import SqliteStore

CACHE = Path(__file__).resolve().parent / ".cache" / "frontier"
ORIGINS = 1000
LIVE = 4  # live origins served on 127.0.0.1 (their URLs are part of the N)


def fake(i: int) -> str:
    """An origin on a closed loopback port: no DNS lookup, no traffic off 127.0.0.0/8."""
    return f"http://127.0.0.1:{20000 + i}"


def build(path: Path, n: int, live: list[str]) -> None:
    """N candidates over ORIGINS origins (the first LIVE are real), 10% marked crawled."""
    if path.exists():
        return
    tmp = path.with_suffix(".tmp")
    for suffix in ("", "-wal", "-shm"):
        Path(str(tmp) + suffix).unlink(missing_ok=True)
    store = SqliteStore(str(tmp))
    origins = live + [fake(i) for i in range(ORIGINS - len(live))]
    store.add_origins(origins, seed=True)
    rng = random.Random(n)
    batch: list[Link] = []
    for i in range(n):
        origin = origins[i % ORIGINS]
        batch.append(Link(f"{origin}/page/{i}?q={rng.randrange(1 << 30)}", origin, 1, rng.random()))
        if len(batch) == 20000:
            store.add_links(batch)
            batch.clear()
    store.add_links(batch)
    store.close()
    con = sqlite3.connect(str(tmp))
    con.execute("UPDATE candidates SET state = 'CRAWLED', next_due = 4e9, exit_code = 'OK' "
                "WHERE id % 10 = 0")
    con.commit()
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    tmp.rename(path)


def synced_copy(path: Path, copy: Path, warm: bool) -> None:
    """Copy a built database and put the copy on disk before timing starts.

    A crawl database is on disk after its checkpoints; an unsynced copy's first checkpoint would
    write out the whole file (3 GB at 10M) inside a measurement. warm: read once, so that the OS
    caches it as it would a crawl's database that fits its RAM; the copy and its original may not
    both fit the page cache.
    """
    shutil.copyfile(path, copy)
    fd = os.open(copy, os.O_RDONLY)
    try:
        os.fsync(fd)
        while warm and os.read(fd, 1 << 20):
            pass
    finally:
        os.close(fd)


@contextmanager
def fresh_copy(path: Path, warm: bool) -> Iterator[Path]:
    """A throw-away synced copy of a built database: every measurement starts from one state."""
    copy = path.with_suffix(".copy.db")
    synced_copy(path, copy, warm)
    try:
        yield copy
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(str(copy) + suffix).unlink(missing_ok=True)


def measure_store(path: Path, n: int) -> dict[str, float]:
    """Fill-todo latency and link-insert throughput (on a fresh copy)."""
    store = SqliteStore(str(path))
    run = store.begin_run()
    origins = [fake(i) for i in range(200)]
    started = time.perf_counter()
    for origin in origins:
        store.take_todo(origin, run, 64, time.time())
    fill_ms = (time.perf_counter() - started) / len(origins) * 1000
    rng = random.Random(1)
    new = [Link(f"{fake(i % 900)}/new/{n}/{i}", fake(i % 900), 2, 0.3) for i in range(20000)]
    # a random sample: ids spaced n/20,000 apart were all multiples of 10 at 10M (all crawled
    # rows, which an upsert leaves alone) and half of them at 100k
    ids = rng.sample(range(1, n + 1), min(n, 20000))
    taken = set(ids)  # the group-commit sample: 20k others (the first pass leaves them cached)
    more = [i for i in random.Random(2).sample(range(1, n + 1), min(n, 40000)) if i not in taken]
    known = known_links(path, ids)
    known_grouped = known_links(path, more[:20000])
    rng.shuffle(new)
    rng.shuffle(known)  # a crawl finds known links in no particular order
    rng.shuffle(known_grouped)
    out: dict[str, float] = {"fill_todo_ms": fill_ms}
    groups = []
    for g in range(5):
        group = [Link(f"{fake(i % 900)}/grouped{g}/{n}/{i}", fake(i % 900), 2, 0.3)
                 for i in range(20000)]
        rng.shuffle(group)
        groups.append(group)
    for name, batches, commit_interval in (
        ("insert_new_per_s", [new], 0.0),
        ("insert_known_per_s", [known], 0.0),
        # as a crawl does, with group commit; each group is committed (flush) as it ends
        ("insert_new_grouped_per_s", groups, CrawlConfig().commit_interval),
        ("insert_known_grouped_per_s", [known_grouped], CrawlConfig().commit_interval),
    ):
        store.commit_interval = commit_interval
        started = time.perf_counter()
        for links in batches:
            for i in range(0, len(links), 30):
                store.add_links(links[i:i + 30])
            store.flush()
        out[name] = sum(map(len, batches)) / (time.perf_counter() - started)
    store.finish_run(run)
    store.close()
    return out


def known_links(path: Path, ids: list[int]) -> list[Link]:
    """The candidates with these ids as links found again (score 0.1: raises about 9 % of them)."""
    con = sqlite3.connect(str(path))
    rows = []
    for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
        marks = ", ".join("?" * len(chunk))
        rows += con.execute(f"SELECT url, origin FROM candidates WHERE id IN ({marks})",
                            chunk).fetchall()
    con.close()
    return [Link(u, o, 2, 0.1) for u, o in rows]


def measure_resume(path: Path, site: LocalSite) -> dict[str, float]:
    """Start `courtly crawl` on the database (a fresh copy): time to first request, peak RSS."""
    first_hit = len(site.hits)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "courtly", "crawl", "--db", str(path), "--min-delay", "0",
         "--max-actions", "300", "--progress", "off"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = None
    peak = 0
    while proc.poll() is None:
        if first is None and len(site.hits) > first_hit:
            first = site.hits[first_hit].arrived - started
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            peak = max(peak, next(int(line.split()[1]) for line in status.splitlines()
                                  if line.startswith("VmHWM")))
        except (OSError, StopIteration):
            pass
        time.sleep(0.005)
    if first is None and len(site.hits) > first_hit:
        first = site.hits[first_hit].arrived - started
    return {"resume_to_first_request_s": first or float("nan"), "peak_rss_mb": peak / 1024,
            "crawl_exit": float(proc.returncode)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    ap.add_argument("--repeat", type=int, default=3,
                    help="store measurements per size, each on a fresh copy (medians reported)")
    ap.add_argument("--cold", dest="warm", action="store_false",
                    help="do not read the database into the OS page cache before measuring")
    args = ap.parse_args()
    CACHE.mkdir(parents=True, exist_ok=True)
    pages = {"/": Page(html("home", []))}
    sites = {f"live{i}": dict(pages) for i in range(LIVE)}
    results = {}
    with LocalSite(sites, first_port=19101) as site:
        live = [site.origins[f"live{i}"] for i in range(LIVE)]
        for n in args.sizes:
            path = CACHE / f"frontier-{n}.db"
            t0 = time.monotonic()
            build(path, n, live)
            built = time.monotonic() - t0
            row = {"n": n, "build_s": built, "db_mb": path.stat().st_size / 1e6}
            repeats = []
            for _ in range(args.repeat):
                with fresh_copy(path, args.warm) as copy:
                    repeats.append(measure_store(copy, n))
                print(json.dumps({"n": n, "repeat": len(repeats)} | repeats[-1]), flush=True)
            row |= {key: statistics.median(r[key] for r in repeats) for key in repeats[0]}
            with fresh_copy(path, args.warm) as copy:
                row |= measure_resume(copy, site)
            results[n] = row
            print(json.dumps(row), flush=True)
    print()
    print("| known URLs | fill todo (ms) | insert new links/s | re-insert known/s "
          "| new links/s, group commit | known/s, group commit | resume → first request (s) "
          "| peak RSS (MB) | db size (MB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, r in results.items():
        print(f"| {n:,} | {r['fill_todo_ms']:.2f} | {r['insert_new_per_s']:,.0f} | "
              f"{r['insert_known_per_s']:,.0f} | {r['insert_new_grouped_per_s']:,.0f} | "
              f"{r['insert_known_grouped_per_s']:,.0f} | "
              f"{r['resume_to_first_request_s']:.2f} | {r['peak_rss_mb']:.0f} | "
              f"{r['db_mb']:,.0f} |")
    print(f"\nmachine: {os.cpu_count()} cores, Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
