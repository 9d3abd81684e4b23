"""Distributed crawling benchmark: aggregate pages/s with 1, 2 and 4 workers on one PostgreSQL.

    .venv/bin/python bench/distributed_bench.py [--origins 32] [--pages 100] [--workers 1,2,4]

Serves ORIGINS x PAGES small pages on 127.0.0.1 (courtly.site.LocalSite, in this process), adds the
seeds to a fresh schema, starts N `courtly worker` processes with no politeness delay (so that
the crawler and the database, not the delay, are the limit) and measures:

- pages/s: crawl actions over the span from the first to the last action (process start-up,
  about a second of imports, is not counted);
- database time per page: PostgreSQL's own `active_time` (pg_stat_database, time spent executing
  statements in the database) over the run, divided by the pages;
- worker CPU per page (user + sys of the worker processes), and where the machine's CPU went.

Needs the PostgreSQL server of the tests (COURTLY_TEST_POSTGRES, default 127.0.0.1:5432/test).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import string
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from courtly.site import LocalSite, Page, html

BASE = os.environ.get("COURTLY_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def site_map(origins: int, pages: int) -> dict[str, dict[str, Page]]:
    """Pages of ~300 random words (distinct, as real pages are: near-dup lookups stay cheap)."""
    rng = random.Random(7)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9)))
             for _ in range(5000)]
    sites = {}
    for o in range(origins):
        content = {"/": Page(html(f"o{o}", [f"/p{k}" for k in range(min(pages, 20))]))}
        for k in range(pages):
            links = [f"/p{(k + j) % pages}" for j in range(1, 6)]
            text = " ".join(rng.choices(words, k=300))
            content[f"/p{k}"] = Page(html(f"o{o} p{k}", links, body=text))
        sites[f"o{o}"] = content
    return sites


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def postgres_cpu() -> float:
    """CPU seconds (user + sys) of every postgres process on this machine, from /proc."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        if name.startswith("postgres"):
            fields = stat[stat.rindex(")") + 2:].split()
            total += sum(int(x) for x in fields[11:15]) / tick  # incl. exited backends
    return total


def active_ms(conn: psycopg.Connection[Any]) -> float:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT active_time FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    return float(row[0]) if row and row[0] is not None else 0.0


def run(site: LocalSite, workers: int, concurrency: int) -> dict[str, float]:
    schema = f"courtly_bench_{uuid.uuid4().hex[:8]}"
    url = f"{BASE}?schema={schema}"
    config = Path(tempfile.mkdtemp(prefix="courtly-bench-")) / "fleet.toml"
    config.write_text("[fleet]\nlease_seconds = 10\n")
    py = sys.executable
    seeds = [site.url(name) for name in site.sites]
    subprocess.run([py, "-m", "courtly", "add-seeds", *seeds, "--db", url], check=True,
                   capture_output=True)
    admin = psycopg.connect(BASE, autocommit=True)
    before_ms = active_ms(admin)
    busy0, total0 = cpu_times()
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    self0 = resource.getrusage(resource.RUSAGE_SELF)
    pg0 = postgres_cpu()
    started = time.monotonic()
    procs = [
        subprocess.Popen([py, "-m", "courtly", "worker", "--db", url, "--min-delay", "0",
                          "--concurrency", str(concurrency), "--progress", "off",
                          "--config", str(config)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(workers)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"worker failed: {err}")
    wall = time.monotonic() - started
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    self1 = resource.getrusage(resource.RUSAGE_SELF)
    pg_cpu = postgres_cpu() - pg0
    busy1, total1 = cpu_times()
    after_ms = active_ms(admin)
    admin.execute(f"SET search_path TO {schema}")
    pages, first, last = admin.execute(
        "SELECT COUNT(*), MIN(started), MAX(started + elapsed) FROM crawl_log"
    ).fetchone()
    per_worker = [n for (n,) in admin.execute(
        "SELECT COUNT(*) FROM crawl_log GROUP BY worker ORDER BY 1 DESC")]
    admin.execute("SET search_path TO public")
    admin.execute(f"DROP SCHEMA {schema} CASCADE")
    admin.close()
    span = max(1e-9, last - first)
    worker_cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    return {
        "workers": workers, "pages": pages, "span": span, "wall": wall,
        "pages_per_s": pages / span, "db_ms_per_page": (after_ms - before_ms) / pages,
        "worker_cpu_ms_per_page": 1000 * worker_cpu / pages,
        "pg_cpu_ms_per_page": 1000 * pg_cpu / pages,
        "site_cpu_ms_per_page": 1000 * ((self1.ru_utime - self0.ru_utime)
                                        + (self1.ru_stime - self0.ru_stime)) / pages,
        "machine_cpu": (busy1 - busy0) / max(1.0, total1 - total0),
        "per_worker": per_worker,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--origins", type=int, default=32)
    parser.add_argument("--pages", type=int, default=100)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; {args.origins} origins x {args.pages + 1} pages; "
          f"PostgreSQL at {BASE}")
    with LocalSite(site_map(args.origins, args.pages)) as site:
        print("| workers | pages | pages/s | DB active ms/page | CPU ms/page: workers "
              "| postgres | test site | machine CPU | pages per worker |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for n in [int(x) for x in args.workers.split(",")]:
            site.hits.clear()
            r = run(site, n, args.concurrency)
            print(f"| {n} | {r['pages']} | {r['pages_per_s']:.0f} | {r['db_ms_per_page']:.2f} "
                  f"| {r['worker_cpu_ms_per_page']:.1f} | {r['pg_cpu_ms_per_page']:.1f} "
                  f"| {r['site_cpu_ms_per_page']:.1f} | {100 * r['machine_cpu']:.0f}% "
                  f"| {', '.join(map(str, r['per_worker']))} |", flush=True)


if __name__ == "__main__":
    main()
