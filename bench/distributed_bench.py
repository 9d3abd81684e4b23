"""Distributed crawling benchmark: SQLite mode and 1, 2, 4 PostgreSQL workers, same web, one run.

    .venv/bin/python bench/distributed_bench.py [--origins 100] [--pages 80] [--workers 1,2]
    .venv/bin/python bench/distributed_bench.py --origins 200 --pages 20 --workers 4 --no-sqlite

Serves the synthetic web of bench/site.py (ORIGINS x PAGES, robots.txt, redirects, 404s) with
nginx (bench/nginx.py), crawls it once in SQLite mode (`courtly crawl`), then, for each N, adds
the seeds to a fresh PostgreSQL schema and starts N `courtly worker` processes; no politeness
delay (the crawler and the database, not the delay, are the limit). For each it reports:

- first, what the machine's cores give together (`cores_at_once`: CPU-bound processes, one per
  core, at once, against one alone);
- pages/s: crawl actions over the span from the first to the last action (process start-up,
  about a second of imports, is not counted);
- coverage: distinct URLs crawled, and URLs crawled more than once;
- statements and round trips a crawl action (the workers' own counters, `-v` log line);
- CPU ms a page of the crawl processes and of PostgreSQL: the crawl's own server processes
  (found by their application_name, sampled every 0.1 s), not the other clients of a shared
  server; the machine's CPU use (all cores, every process: the machine may be shared);
- with --separate, for each N > 1 also N workers each crawling every N-th seed's origin alone
  (a schema each, at once): the fleet's division of the web without the fleet, what the
  machine gives N such crawls;
- with --parse-workers 0, pages analysed on each crawl's own loop (no page worker: one process
  a crawl), every mode alike;
- with --rounds N, the whole set N times, then the medians of each mode's pages/s and of the
  ratios taken within each round;
- then a second table, while every worker crawls (the start-up and the tail left out): pages/s,
  the CPU a page of each part (the workers' event-loop threads, their database threads, their
  page workers, their PostgreSQL server processes, and the rest of the machine: nginx, the
  sampler, anything else), the machine's CPU use, and an origin's cycle (the median time
  between the starts of its consecutive crawl actions: an origin has one request at a time,
  so N origins crawl at most N pages a cycle);
- pages per worker, and the largest deviation from their mean: over the whole crawl, and
  while every worker crawls (from the last one's first action to the first one's last); when
  each worker's first action came after the first worker's, and its last before the crawl's.

Needs the PostgreSQL server of the tests (COURTLY_TEST_POSTGRES, default 127.0.0.1:5432/test).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

BENCH = Path(__file__).resolve().parent
BASE = os.environ.get("COURTLY_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
TOML = """\
progress = "off"
[politeness]
max_crawl_delay = 0
crawl_delay_above_cap = "clamp"
[limits]
allow_private_addresses = true
[fleet]
lease_seconds = 10
"""
_COUNTERS = re.compile(r"database: (\d+) statements in (\d+) round trips")


sys.path.insert(0, str(BENCH))
import run  # noqa: E402  (bench/run.py loads bench/site.py and nginx.py by path)

synth, nginx_mod = run.synth, run.nginx_mod


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + sys) of one process, from /proc; None once it has exited."""
    return process_cpu_at(f"/proc/{pid}/stat")


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of one process ({} once it has exited)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        cpu = process_cpu_at(f"/proc/{pid}/task/{task.name}/stat")
        if cpu is not None:
            out[int(task.name)] = cpu
    return out


def process_cpu_at(stat_path: str) -> float | None:
    """CPU seconds (user + sys) from one /proc stat file; None once it is gone."""
    try:
        with open(stat_path) as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return sum(int(x) for x in fields[11:13]) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The direct children of a process (a worker's page worker)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):  # the process just ended
            out += [int(c) for c in task.read_text().split()]
    return out


#: the parts of a crawl whose CPU the sampler follows, in the steady table's order
PARTS = ("crawl loop", "database thread", "page worker", "PostgreSQL", "rest of the machine")


class Sampler(threading.Thread):
    """Every 0.1 s until stopped: the cumulative CPU of each part of the crawl (the workers'
    event-loop threads, their other threads, their page workers, the PostgreSQL server processes
    serving these crawl schemas, found by their application_name `courtly:SCHEMA`) and of the
    whole machine, with the time; for the figures while every worker crawls (`steady`)."""

    def __init__(self, schemas: list[str] | None) -> None:
        super().__init__(daemon=True)
        self.apps = [f"courtly:{schema}" for schema in schemas or []]
        self.pids: list[int] = []  # the crawl processes, added as they start
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.seen: dict[tuple[str, int], float] = {}  # (part, pid or tid): its last CPU
        self.backends: dict[int, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        admin = psycopg.connect(BASE, autocommit=True) if self.apps else None
        try:
            while not self.done.is_set():
                self.sample(admin)
                self.done.wait(0.1)
        finally:
            if admin is not None:
                admin.close()

    def sample(self, admin: psycopg.Connection[Any] | None) -> None:
        for pid in list(self.pids):
            for tid, cpu in thread_cpu(pid).items():
                self.seen["crawl loop" if tid == pid else "database thread", tid] = cpu
            for child in children(pid):
                worker = process_cpu(child)
                if worker is not None:
                    self.seen["page worker", child] = worker
        if admin is not None:
            for (pid,) in admin.execute("SELECT pid FROM pg_stat_activity WHERE "
                                        "application_name = ANY(%s)", (self.apps,)).fetchall():
                backend = process_cpu(pid)
                if backend is not None:
                    self.backends[pid] = self.seen["PostgreSQL", pid] = backend
        parts = dict.fromkeys(PARTS, 0.0)
        for (part, _), cpu in self.seen.items():
            parts[part] += cpu
        busy, _total = cpu_times()
        hz = os.sysconf("SC_CLK_TCK")
        parts["rest of the machine"] = busy / hz - sum(parts.values())
        parts["machine"], parts["machine total"] = busy / hz, _total / hz
        self.samples.append((time.time(), parts))

    def stop(self) -> float:
        """Stop; the PostgreSQL processes' CPU (a process's last 0.1 s may be missed)."""
        self.done.set()
        self.join()
        return sum(self.backends.values())

    def between(self, lo: float, hi: float) -> dict[str, float] | None:
        """Each part's CPU seconds from lo to hi (the samples nearest inside), and the machine's
        busy share; None if the span holds fewer than two samples."""
        inside = [(t, parts) for t, parts in self.samples if lo <= t <= hi]
        if len(inside) < 2:
            return None
        (t0, a), (t1, b) = inside[0], inside[-1]
        out = {part: b[part] - a[part] for part in PARTS}
        out["seconds"] = t1 - t0
        out["machine"] = (b["machine"] - a["machine"]) / max(
            1e-9, b["machine total"] - a["machine total"])
        out["from"], out["to"] = t0, t1
        return out


class Measure:
    """CPU of the children, of the crawl's PostgreSQL processes and of the machine between
    start and stop; the sampler's figures for any span in between."""

    def __init__(self, schemas: list[str] | None = None) -> None:
        self.sampler = Sampler(schemas)
        self.pg_cpu = 0.0

    def __enter__(self) -> Measure:
        self.busy0, self.total0 = cpu_times()
        self.usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        busy1, total1 = cpu_times()
        self.pg_cpu = self.sampler.stop()
        self.crawl_cpu = (usage1.ru_utime - self.usage0.ru_utime) + (
            usage1.ru_stime - self.usage0.ru_stime)
        self.machine = (busy1 - self.busy0) / max(1.0, total1 - self.total0)


def _wait(procs: list[subprocess.Popen[str]]) -> list[str]:
    errs = []
    for proc in procs:
        _, err = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"crawl failed ({proc.returncode}): {err[-2000:]}")
        errs.append(err)
    return errs


def summary(mode: str, log: list[tuple[str, float, float, str | None]], m: Measure,
            counters: tuple[int, int] | None) -> dict[str, Any]:
    """The figures of one crawl from its crawl log rows (url, started, elapsed, worker)."""
    pages = len(log)
    first = min(r[1] for r in log)
    last = max(r[1] + r[2] for r in log)
    span = max(1e-9, last - first)
    urls: dict[str, int] = {}
    for r in log:
        urls[r[0]] = urls.get(r[0], 0) + 1
    per_worker: dict[str, int] = {}
    for r in log:
        per_worker[r[3] or ""] = per_worker.get(r[3] or "", 0) + 1
    shares = sorted(per_worker.values(), reverse=True)
    mean = pages / len(shares)
    # while every worker crawls: from the last one's first action to the first one's last (the
    # processes' start-up, seconds apart on a loaded machine, and the crawl's tail left out)
    starts = {w: min(r[1] for r in log if (r[3] or "") == w) for w in per_worker}
    ends = {w: max(r[1] for r in log if (r[3] or "") == w) for w in per_worker}
    lo, hi = max(starts.values()), min(ends.values())
    together = Counter((r[3] or "") for r in log if lo <= r[1] <= hi)
    cpu = m.sampler.between(lo, hi)
    steady: dict[str, Any] | None = None
    if cpu is not None:
        done = sum(1 for r in log if cpu["from"] <= r[1] < cpu["to"])
        steady = {"mode": mode, "pages_per_s": done / cpu["seconds"],
                  "machine": cpu["machine"], "cycle_ms": 1000 * origin_cycle(log),
                  "us": {part: 1e6 * cpu[part] / max(1, done) for part in PARTS}}
    shares_together = [together.get(w, 0) for w in per_worker]
    steady_mean = sum(shares_together) / len(shares_together)
    return {
        "mode": mode, "pages": pages, "urls": len(urls),
        "twice": sum(1 for n in urls.values() if n > 1), "span": span,
        "pages_per_s": pages / span,
        "statements": counters[0] / pages if counters else None,
        "round_trips": counters[1] / pages if counters else None,
        "crawl_cpu_ms": 1000 * m.crawl_cpu / pages, "pg_cpu_ms": 1000 * m.pg_cpu / pages,
        "machine": m.machine, "shares": shares,
        "spread": max(abs(s - mean) for s in shares) / mean,
        "steady": sorted(shares_together, reverse=True), "steady_span": max(0.0, hi - lo),
        "steady_spread": max(abs(s - steady_mean) for s in shares_together)
        / max(1e-9, steady_mean),
        "cpu": steady,
        "starts": sorted(starts[w] - first for w in per_worker),
        "ends": sorted(last - ends[w] for w in per_worker),
    }


def origin_cycle(log: list[tuple[str, float, float, str | None]]) -> float:
    """The median time between the starts of an origin's consecutive crawl actions: the cycle
    each origin's pages take turns in (one request at a time per origin)."""
    by_origin: dict[str, list[float]] = {}
    for url, started, _, _ in log:
        by_origin.setdefault(url.split("/")[2], []).append(started)
    gaps = [b - a for starts in by_origin.values()
            for a, b in zip(sorted(starts), sorted(starts)[1:], strict=False)]
    return statistics.median(gaps) if gaps else 0.0


def _start(cmds: list[list[str]], m: Measure) -> list[subprocess.Popen[str]]:
    """Start the crawl processes; the sampler follows each."""
    procs = []
    for cmd in cmds:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        m.sampler.pids.append(proc.pid)
        procs.append(proc)
    return procs


def run_sqlite(seeds: list[str], work: Path, toml: Path, concurrency: int) -> dict[str, Any]:
    db = work / f"sqlite-{uuid.uuid4().hex[:6]}.db"
    cmd = [sys.executable, "-m", "courtly", "crawl", *seeds, "--db", str(db), "--min-delay", "0",
           "--concurrency", str(concurrency), "--config", str(toml)]
    with Measure() as m:
        _wait(_start([cmd], m))
    with sqlite3.connect(db) as con:
        log = con.execute("SELECT url, started, elapsed, worker FROM crawl_log").fetchall()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    return summary("SQLite", log, m, None)


def run_workers(seeds: list[str], workers: int, toml: Path, concurrency: int,
                separate: bool = False) -> dict[str, Any]:
    """`workers` `courtly worker`s sharing one crawl (a schema); or, `separate`, each crawling
    its own share of the seeds (every N-th) alone, in a schema of its own, all at once: the
    fleet's division of the web without the fleet (no shared tables, leases or hand-overs)."""
    schema = f"courtly_bench_{uuid.uuid4().hex[:8]}"
    schemas = [f"{schema}_{i}" for i in range(workers)] if separate else [schema]
    py = sys.executable
    for i, name in enumerate(schemas):
        share = seeds[i::len(schemas)]
        subprocess.run([py, "-m", "courtly", "add-seeds", *share, "--db",
                        f"{BASE}?schema={name}"], check=True, capture_output=True)
    cmds = [[py, "-m", "courtly", "-v", "worker", "--db", f"{BASE}?schema={name}",
             "--min-delay", "0", "--concurrency", str(concurrency), "--config", str(toml)]
            for name in schemas]
    with Measure(schemas) as m:
        errs = _wait(_start([cmds[i % len(cmds)] for i in range(workers)], m))
    statements = round_trips = 0
    for err in errs:
        for found in _COUNTERS.finditer(err):
            statements += int(found.group(1))
            round_trips += int(found.group(2))
    log: list[tuple[str, float, float, str | None]] = []
    with psycopg.connect(BASE, autocommit=True) as admin:
        for i, name in enumerate(schemas):
            admin.execute(f"SET search_path TO {name}")
            crawled = admin.execute("SELECT url, started, elapsed, worker FROM crawl_log")
            log += [(f"{i} {url}", *rest) for url, *rest in crawled.fetchall()]  # per crawl
            admin.execute("SET search_path TO public")
            admin.execute(f"DROP SCHEMA {name} CASCADE")
    counters = (statements, round_trips) if round_trips else None
    mode = f"PostgreSQL, {workers} worker{'s' * (workers > 1)}"
    return summary(mode + (", each its share alone" if separate else ""), log, m, counters)


def row(r: dict[str, Any], base: float | None) -> str:
    def opt(value: float | None) -> str:
        return "–" if value is None else f"{value:.1f}"

    ratio = f"{r['pages_per_s'] / base:.2f}×" if base else "–"
    return (f"| {r['mode']} | {r['pages']} | {r['urls']} | {r['twice']} "
            f"| {r['pages_per_s']:.0f} | {ratio} | {opt(r['statements'])} "
            f"| {opt(r['round_trips'])} | {r['crawl_cpu_ms']:.2f} | {r['pg_cpu_ms']:.2f} "
            f"| {100 * r['machine']:.0f}% | {', '.join(map(str, r['shares']))} "
            f"| ±{100 * r['spread']:.0f}% | {', '.join(map(str, r['steady']))} in "
            f"{r['steady_span']:.1f} s | ±{100 * r['steady_spread']:.0f}% "
            f"| {', '.join(f'{t:.1f}' for t in r['starts'])} "
            f"| {', '.join(f'{t:.1f}' for t in r['ends'])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--origins", type=int, default=100)
    parser.add_argument("--pages", type=int, default=80)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--base-port", type=int, default=28001)
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole set")
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL workers only")
    parser.add_argument("--separate", action="store_true",
                        help="for each N > 1, also N workers each crawling its share alone")
    parser.add_argument("--parse-workers", type=int, default=1, choices=(0, 1),
                        help="0: pages analysed on each crawl's loop (one process a crawl)")
    args = parser.parse_args()
    params = synth.Params(args.origins, args.pages, 1, args.base_port)
    site_dir, manifest = synth.load_or_generate(params, BENCH / ".cache" / "sites")
    seeds = list(manifest["seeds"])
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start "
          f"(a shared machine: other processes' CPU counts in 'machine CPU'); "
          f"{os.cpu_count()} CPU-bound processes at once do {cores_at_once():.2f}x the work of "
          f"one; "
          f"{args.origins} origins x {args.pages} pages (bench/site.py, nginx); "
          f"concurrency {args.concurrency}; parse_workers {args.parse_workers}; "
          f"PostgreSQL at {BASE}; {time.strftime('%H:%M UTC')}")
    print("| mode | pages | URLs | URLs twice | pages/s | × SQLite | statements/page "
          "| round trips/page | crawl CPU ms/page | postgres CPU ms/page | machine CPU "
          "| pages per worker | spread | pages per worker while all crawl | spread "
          "| first action (s after the first worker's) | last action (s before the crawl's end) |")
    print("|" + " --- |" * 17)
    with tempfile.TemporaryDirectory(prefix="courtly-dbench-") as tmp, \
            nginx_mod.Nginx(site_dir, args.origins, args.base_port):
        work = Path(tmp)
        toml = work / "crawl.toml"
        toml.write_text(f"parse_workers = {args.parse_workers}\n{TOML}")
        rounds: list[dict[str, float]] = []
        steady: list[dict[str, Any]] = []
        for _ in range(args.rounds):
            base = None
            rates: dict[str, float] = {}
            runs: list[tuple[str, Any]] = [] if args.no_sqlite else [("SQLite", None)]
            for n in [int(x) for x in args.workers.split(",")]:
                runs.append((f"{n} worker{'s' * (n > 1)}", (n, False)))
                if args.separate and n > 1:
                    runs.append((f"{n} alone", (n, True)))
            for name, how in runs:
                if how is None:
                    r = run_sqlite(seeds, work, toml, args.concurrency)
                    base = r["pages_per_s"]
                else:
                    r = run_workers(seeds, how[0], toml, args.concurrency, separate=how[1])
                rates[name] = r["pages_per_s"]
                print(row(r, base), flush=True)
                if r["cpu"] is not None:
                    steady.append(r["cpu"])
            rounds.append(rates)
    print(steady_table(steady))
    if len(rounds) > 1:
        print(medians(rounds))


SPIN = ("import time\nstart = time.perf_counter()\nn = 0\n"
        "while n < 10_000_000: n += 1\nprint(time.perf_counter() - start)")


def cores_at_once() -> float:
    """What the machine's cores give together: as many CPU-bound Python processes as it has
    cores, at once, against one alone (work a second; a machine whose cores do less while all
    are busy, or whose host takes some of their time, gives less than its count)."""
    def spin(n: int) -> float:
        procs = [subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE)
                 for _ in range(n)]
        return max(float(p.communicate()[0]) for p in procs)

    count = os.cpu_count() or 1
    return count * spin(1) / spin(count) if count > 1 else 1.0


def steady_table(rows: list[dict[str, Any]]) -> str:
    """While every worker crawls (the start-up and the tail left out): pages/s, the CPU a page
    of each part of the crawl and of the rest of the machine (nginx, other PostgreSQL
    processes, anything else running), the machine's CPU use, and an origin's cycle."""
    lines = ["", "While every worker crawls:", "",
             "| mode | pages/s | " + " | ".join(f"{part} µs/page" for part in PARTS)
             + " | all µs/page | machine CPU | an origin's cycle (ms, median) |",
             "|" + " --- |" * (len(PARTS) + 5)]
    for r in rows:
        us = r["us"]
        lines.append(f"| {r['mode']} | {r['pages_per_s']:.0f} | "
                     + " | ".join(f"{us[part]:.0f}" for part in PARTS)
                     + f" | {sum(us.values()):.0f} | {100 * r['machine']:.0f}% "
                     f"| {r['cycle_ms']:.1f} |")
    return "\n".join(lines)


def medians(rounds: list[dict[str, float]]) -> str:
    """The medians over the rounds of each mode's pages/s and of the ratios taken in each round
    (a ratio's two runs a minute apart: on a machine whose speed drifts, steadier than the ratio
    of two medians)."""
    modes = list(rounds[0])
    rates = ", ".join(f"{m} {statistics.median(r[m] for r in rounds):.0f}" for m in modes)
    lines = [f"medians of {len(rounds)} rounds, pages/s: {rates}"]
    workers = [m for m in modes if m != "SQLite"]
    pairs = [(m, "SQLite") for m in workers if "SQLite" in modes]
    pairs += [(m, workers[0]) for m in workers[1:]]
    for top, bottom in pairs:
        ratios = [r[top] / r[bottom] for r in rounds]
        each = ", ".join(f"{x:.2f}" for x in ratios)
        lines.append(f"  {top} / {bottom}: {statistics.median(ratios):.2f}× (rounds: {each})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
