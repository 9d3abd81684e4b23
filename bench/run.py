"""The benchmark driver of issue 6: courtly vs Scrapy on a synthetic multi-origin web.

Generates the site (cached under bench/.cache/sites), starts nginx (one loopback port per origin),
then runs courtly and Scrapy alternately, each as a child process, and measures for each run:

- pages/s: distinct URLs fetched with an HTTP response (robots.txt excluded) / wall time of the
  whole crawl process (start-up included);
- CPU ms/page: user+sys CPU of the child (os.wait4 rusage) / pages;
- peak memory: the larger of the child's ru_maxrss (os.wait4) and the peak PSS of its process
  tree, sampled every 0.2 s (courtly's page worker is a second process);
- coverage: fetched ∩ manifest-required / required, and rule violations (disallowed, nofollow-only
  and out-of-scope URLs fetched, other extra URLs);
- duplicate fetches: URLs with more than one HTTP response (courtly: crawl_log rows with an
  http_status; Scrapy: the spider's own count).

Both run with politeness off (courtly --min-delay 0 and [politeness] max_crawl_delay = 0 so the
site's Crawl-delay is clamped to 0; Scrapy DOWNLOAD_DELAY 0, which ignores Crawl-delay anyway),
the same concurrency, at most one request in flight per origin.

Politeness-efficiency mode (issue 3): ``--politeness H d`` crawls H origins with a delay of d
seconds per origin and reports the achieved pages/s against the ideal H/d.

Every child is bounded by --timeout; the driver always stops nginx and its children.

Usage:
  .venv/bin/python bench/run.py [--origins 50] [--pages 1000] [--concurrency 16] [--rounds 2]
                                [--only scrapy|courtly] [--timeout 1800] [--json OUT]
  .venv/bin/python bench/run.py --politeness 10 0.5 [--per-origin 20]
  .venv/bin/python bench/run.py --only courtly --frontier bench/.cache/frontier/frontier-10000000.db
  .venv/bin/python bench/run.py --view    # courtly alone vs courtly --serve with a page open
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import importlib.util
import json
import os
import platform
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
CACHE = BENCH / ".cache"
SCRAPY_VENV = BENCH / ".venv-scrapy"
SCRAPY_PIN = "scrapy==2.19.0"
COURTLY = ROOT / ".venv" / "bin" / "courtly"


def _load(name: str, file: str) -> ModuleType:
    # bench/site.py would be shadowed by the stdlib `site` module: load it by path
    spec = importlib.util.spec_from_file_location(name, BENCH / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


synth = _load("courtly_bench_site", "site.py")
nginx_mod = _load("courtly_bench_nginx", "nginx.py")


# ---------------------------------------------------------------------------------------------
# running a child, measured


@dataclass
class Proc:
    wall: float
    cpu_user: float
    cpu_sys: float
    maxrss_kb: int
    returncode: int
    timed_out: bool
    t_start: float  # time.time() at spawn
    t_end: float


def _tree(pid: int) -> list[int]:
    """pid and all its descendants (from /proc/PID/task/TID/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):  # the process just ended
                todo.extend(int(c) for c in task.read_text().split())
    return out


def _proc_kb(pid: int, file: str, field: str) -> int:
    """A "Field:  N kB" line of /proc/PID/<file> (0 once the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/{file}").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in text.splitlines()
                 if line.startswith(field + ":")), 0)


def tree_pss_kb(pid: int) -> int:
    """Proportional set size of pid and its descendants (shared pages counted once in all)."""
    return sum(_proc_kb(p, "smaps_rollup", "Pss") for p in _tree(pid))


def vm_hwm_kb(pid: int) -> int:
    """The peak resident set of one process since its exec (VmHWM)."""
    return _proc_kb(pid, "status", "VmHWM")


def run_measured(cmd: list[str], log: Path, timeout: float, cwd: Path | None = None) -> Proc:
    """Run cmd in its own process group; wall time and CPU from os.wait4; peak memory: the
    larger of the child's VmHWM and the peak PSS of its process tree (both sampled every 0.2 s:
    courtly's page worker is a second process). Not ru_maxrss: Linux carries the driver's own
    peak into a child it spawns, so a driver that just generated the site reported its size."""
    with open(log, "wb") as out:
        start = time.monotonic()
        t_start = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd)
        deadline = start + timeout
        timed_out = False
        killed_at = 0.0
        peak_kb, sampled = 0, 0.0
        try:
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid == proc.pid:
                    break
                now = time.monotonic()
                if now - sampled >= 0.2:
                    sampled = now
                    peak_kb = max(peak_kb, tree_pss_kb(proc.pid), vm_hwm_kb(proc.pid))
                if not timed_out and now > deadline:
                    timed_out = True
                    killed_at = now
                    os.killpg(proc.pid, signal.SIGTERM)
                elif timed_out and now > killed_at + 15:
                    os.killpg(proc.pid, signal.SIGKILL)
                time.sleep(0.02)
        except BaseException:  # the driver is interrupted: take the child's group down with it
            os.killpg(proc.pid, signal.SIGKILL)
            os.waitpid(proc.pid, 0)
            raise
        wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait again
    return Proc(wall, usage.ru_utime, usage.ru_stime, peak_kb,
                proc.returncode, timed_out, t_start, t_start + wall)


# ---------------------------------------------------------------------------------------------
# the two crawlers


def ensure_scrapy() -> str:
    """Create bench/.venv-scrapy with the pinned Scrapy from PyPI if needed; return its version."""
    python = SCRAPY_VENV / "bin" / "python"
    if not (SCRAPY_VENV / "bin" / "scrapy").exists():
        print(f"creating {SCRAPY_VENV} with {SCRAPY_PIN} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(SCRAPY_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", SCRAPY_PIN], check=True)
    out = subprocess.run([str(python), "-c", "import scrapy; print(scrapy.__version__)"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def compile_sources() -> None:
    """Compile courtly's source to bytecode, as pip does for a package it installs.

    courtly is installed editable, and these machines set PYTHONDONTWRITEBYTECODE: each of its
    processes would compile its modules at every start (0.3 billion instructions, not crawl
    work). Scrapy's packages were compiled when pip installed them; its spider is one script.
    """
    compileall.compile_dir(ROOT / "src", quiet=1)


def courtly_works() -> bool:
    if not COURTLY.exists():
        return False
    try:
        out = subprocess.run([str(COURTLY), "crawl", "--help"], capture_output=True,
                             timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return False
    if out.returncode != 0:
        return False
    # `crawl --help` works before the crawler does (its import is lazy): try that import too
    python = COURTLY.parent / "python"
    out = subprocess.run([str(python), "-c", "import courtly.crawler"], capture_output=True,
                         timeout=60, check=False)
    return out.returncode == 0


COURTLY_TOML = """\
progress = "off"
{lean}
[politeness]
# the site's robots.txt says Crawl-delay: 5; politeness is off for the benchmark, so clamp it to 0
max_crawl_delay = 0
crawl_delay_above_cap = "clamp"

[limits]
# the synthetic web is on 127.0.0.1
allow_private_addresses = true
"""


#: --lean: courtly doing what Scrapy does and no more (no content kept, no duplicate detection)
LEAN_TOML = "store_content = false\n[dedup]\nexact = false\nnear = false\n"
LEAN = False
#: --frontier: start courtly from a copy of this database (None: an empty one)
FRONTIER: Path | None = None


@dataclass
class Fetched:
    """What a crawl fetched: normalized URL -> number of HTTP responses, and extra diagnostics."""

    responses: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


#: --view: what a browser with the page open asks every 2 s, and a Prometheus scrape
VIEW_PATHS = ("api/summary", "api/series", "api/origins?sort=errors&order=desc&limit=200",
              "api/errors", "api/workers", "metrics")


def poll_view(log: Path, done: threading.Event, polls: list[int]) -> None:
    """--view: find the URL courtly serves (its log's first lines) and GET the page's endpoints
    every 2 seconds until the crawl is done; counts the polls in `polls`."""
    url = None
    while url is None and not done.wait(0.05):
        found = re.search(rb"serving .* at (http://\S+/)", log.read_bytes()[:4096])
        url = found.group(1).decode() if found else None
    while url is not None and not done.is_set():
        for path in VIEW_PATHS:
            with contextlib.suppress(OSError), urllib.request.urlopen(url + path, timeout=5) as r:
                r.read()
        polls[0] += 1
        done.wait(2.0)


def run_courtly(seeds: list[str], work: Path, tag: str, concurrency: int, timeout: float,
                min_delay: float = 0.0, max_actions: int = 0,
                view: bool = False) -> tuple[Proc, Fetched]:
    db = work / f"{tag}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    if FRONTIER is not None:
        start_from(FRONTIER, db)
    toml = work / "crawl.toml"
    toml.write_text(COURTLY_TOML.format(lean=LEAN_TOML if LEAN else ""))
    cmd = [str(COURTLY), "crawl", *seeds, "--db", str(db), "--min-delay", str(min_delay),
           "--concurrency", str(concurrency), "--config", str(toml)]
    if max_actions:
        cmd += ["--max-actions", str(max_actions)]
    if not view:
        return run_measured(cmd, work / f"{tag}.log", timeout), read_courtly_db(db)
    log, done, polls = work / f"{tag}.log", threading.Event(), [0]
    log.write_bytes(b"")
    poller = threading.Thread(target=poll_view, args=(log, done, polls), daemon=True)
    poller.start()
    try:
        proc = run_measured([*cmd, "--serve", "0"], log, timeout)
    finally:
        done.set()
        poller.join(10)
    fetched = read_courtly_db(db)
    fetched.info["view_polls"] = polls[0]
    return proc, fetched


def start_from(frontier: Path, db: Path) -> None:
    """--frontier: courtly's database is a synced, cached copy of a frontier database
    (bench/frontier_bench.py) whose own origins are not crawled: the crawl's pages are added to
    millions of known URLs."""
    frontier_bench = _load("courtly_bench_frontier", "frontier_bench.py")
    frontier_bench.synced_copy(frontier, db, warm=True)
    con = sqlite3.connect(db)
    try:
        con.execute("UPDATE origins SET configured = 0, seed = 0")
        con.commit()
    finally:
        con.close()


def read_courtly_db(db: Path) -> Fetched:
    fetched = Fetched()
    if not db.exists():
        fetched.info["error"] = "no database"
        return fetched
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        cols = [r[1] for r in con.execute("PRAGMA table_info(crawl_log)")]
        fetched.info["crawl_log_columns"] = cols
        if not cols:
            fetched.info["error"] = "no crawl_log table"
            return fetched
        rows = con.execute("SELECT url, exit_code, http_status FROM crawl_log").fetchall()
        exit_codes: dict[str, int] = {}
        for url, exit_code, status in rows:
            exit_codes[str(exit_code)] = exit_codes.get(str(exit_code), 0) + 1
            if status is None or str(url).endswith("/robots.txt"):
                continue
            u = synth.normalize(str(url))
            fetched.responses[u] = fetched.responses.get(u, 0) + 1
            fetched.statuses[u] = int(status)
        fetched.info["crawl_log_rows"] = len(rows)
        fetched.info["exit_codes"] = dict(sorted(exit_codes.items()))
        ts_col = next((c for c in cols if c in ("started", "started_at", "ts", "time")), None)
        if ts_col is not None:
            end = f"{ts_col} + elapsed" if "elapsed" in cols else ts_col
            span = con.execute(f"SELECT MIN({ts_col}), MAX({end}) FROM crawl_log "
                               "WHERE http_status IS NOT NULL").fetchone()
            fetched.info["response_time_span"] = [span[0], span[1]]
    except sqlite3.Error as exc:
        fetched.info["error"] = f"sqlite: {exc}"
    finally:
        con.close()
    if FRONTIER is not None:
        return fetched  # exporting millions of other candidates would measure the export
    try:  # states of the crawl candidates, through the CLI as a user would see them
        out = subprocess.run([str(COURTLY), "export", "--db", str(db), "--format", "jsonl"],
                             capture_output=True, text=True, timeout=300, check=False)
        states: dict[str, int] = {}
        for line in out.stdout.splitlines():
            if line.strip():
                rec = json.loads(line)
                states[str(rec.get("state"))] = states.get(str(rec.get("state")), 0) + 1
        fetched.info["export_states"] = states
        if out.returncode != 0:
            fetched.info["export_error"] = out.stderr[-500:]
    except (subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        fetched.info["export_error"] = repr(exc)
    return fetched


def run_scrapy(seeds: list[str], work: Path, tag: str, concurrency: int, timeout: float,
               delay: float = 0.0, max_pages: int = 0) -> tuple[Proc, Fetched]:
    seeds_file = work / "seeds.txt"
    seeds_file.write_text("\n".join(seeds) + "\n")
    out = work / f"{tag}.json"
    out.unlink(missing_ok=True)
    cmd = [str(SCRAPY_VENV / "bin" / "python"), str(BENCH / "scrapy_peer" / "spider.py"),
           "--seeds-file", str(seeds_file), "--out", str(out),
           "--concurrency", str(concurrency), "--delay", str(delay),
           "--max-pages", str(max_pages)]
    proc = run_measured(cmd, work / f"{tag}.log", timeout)
    fetched = Fetched()
    if out.exists():
        data = json.loads(out.read_text())
        for url, (count, status) in data["fetched"].items():
            if url.endswith("/robots.txt"):
                continue
            fetched.responses[url] = count
            fetched.statuses[url] = status
        fetched.info["reason"] = data["reason"]
        fetched.info["errors"] = len(data["errors"])
        fetched.info["response_time_span"] = [data.get("first_response"),
                                              data.get("last_response")]
    else:
        fetched.info["error"] = "no output"
    return proc, fetched


# ---------------------------------------------------------------------------------------------
# scoring


@dataclass
class Result:
    tool: str
    round: int
    wall_s: float
    pages: int
    responses: int
    pages_per_s: float
    cpu_ms_per_page: float
    peak_rss_mb: float
    coverage: float
    missing: int
    wrong_status: int
    duplicates: int
    duplicate_responses: int
    disallowed_fetched: int
    nofollow_only_fetched: int
    out_of_scope_fetched: int
    other_extra: int
    returncode: int
    timed_out: bool
    cpu_util: float  # child CPU seconds / wall seconds (1.0 = one core busy)
    load: float  # 1-minute load average at the end (other work on the machine skews figures)
    info: dict[str, Any]


def score(tool: str, rnd: int, proc: Proc, fetched: Fetched,
          manifest: dict[str, Any]) -> Result:
    required = set(manifest["required"])
    mnf = manifest["must_not_fetch"]
    urls = set(fetched.responses)
    pages = len(urls)
    dup_urls = [u for u, n in fetched.responses.items() if n > 1]
    extra = urls - required - set(mnf["disallowed"]) - set(mnf["nofollow_only"]) - set(
        mnf["out_of_scope"])
    missing = sorted(required - urls)
    info = dict(fetched.info)
    if missing:
        info["missing_sample"] = missing[:10]
    if extra:
        info["extra_sample"] = sorted(extra)[:10]
    if dup_urls:
        info["duplicate_sample"] = sorted(dup_urls)[:10]
    expected = {"page": 200, "redirect": 301, "not_found": 404}
    wrong_status = [u for u in urls & required
                    if fetched.statuses.get(u) != expected[manifest["required"][u]]]
    if wrong_status:
        info["wrong_status_sample"] = [(u, fetched.statuses[u]) for u in sorted(wrong_status)[:10]]
    span = info.get("response_time_span")
    if span and span[0] and span[1]:
        # where the wall time goes: before the first response, crawling, after the last one
        info["startup_s"] = round(span[0] - proc.t_start, 2)
        info["crawl_s"] = round(span[1] - span[0], 2)
        info["shutdown_s"] = round(proc.t_end - span[1], 2)
        if span[1] > span[0]:
            info["in_crawl_pages_per_s"] = round(pages / (span[1] - span[0]), 1)
    cpu = proc.cpu_user + proc.cpu_sys
    return Result(
        tool=tool, round=rnd, wall_s=round(proc.wall, 2), pages=pages,
        responses=sum(fetched.responses.values()),
        pages_per_s=round(pages / proc.wall, 1) if proc.wall else 0.0,
        cpu_ms_per_page=round(cpu * 1000 / pages, 3) if pages else float("nan"),
        peak_rss_mb=round(proc.maxrss_kb / 1024, 1),
        # a required URL counts when fetched with the status the site gives it
        coverage=round((len(urls & required) - len(wrong_status)) / len(required), 5)
        if required else 0.0,
        missing=len(missing), wrong_status=len(wrong_status), duplicates=len(dup_urls),
        duplicate_responses=sum(n - 1 for n in fetched.responses.values() if n > 1),
        disallowed_fetched=len(urls & set(mnf["disallowed"])),
        nofollow_only_fetched=len(urls & set(mnf["nofollow_only"])),
        out_of_scope_fetched=len(urls & set(mnf["out_of_scope"])),
        other_extra=len(extra), returncode=proc.returncode, timed_out=proc.timed_out,
        cpu_util=round(cpu / proc.wall, 2) if proc.wall else 0.0, load=loadavg(), info=info,
    )


COLUMNS = [("tool", "tool", 8), ("round", "rnd", 3), ("wall_s", "wall s", 8),
           ("pages", "pages", 7), ("pages_per_s", "pages/s", 8),
           ("cpu_ms_per_page", "CPU ms/pg", 9), ("peak_rss_mb", "RSS MB", 7),
           ("coverage", "coverage", 8), ("wrong_status", "badstat", 7),
           ("duplicates", "dup URLs", 8),
           ("disallowed_fetched", "disallow", 8), ("nofollow_only_fetched", "nofollow", 8),
           ("out_of_scope_fetched", "offscope", 8), ("other_extra", "extra", 6),
           ("cpu_util", "CPU/wall", 8), ("load", "load1", 5), ("returncode", "rc", 3)]


def table(results: list[Result]) -> str:
    head = " ".join(f"{title:>{w}}" for _, title, w in COLUMNS)
    lines = [head, "-" * len(head)]
    for r in results:
        d = asdict(r)
        cells = []
        for key, _, w in COLUMNS:
            v = d[key]
            if key == "round" and v < 0:
                v = "med"
            if key == "returncode" and r.timed_out:
                v = "T/O"
            cells.append(f"{v:>{w}}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def median_result(tool: str, results: list[Result]) -> Result | None:
    rs = [r for r in results if r.tool == tool]
    if not rs:
        return None

    def med(key: str) -> Any:
        return statistics.median(getattr(r, key) for r in rs)

    return Result(tool, -1, med("wall_s"), int(med("pages")), int(med("responses")),
                  round(med("pages_per_s"), 1), round(med("cpu_ms_per_page"), 3),
                  round(med("peak_rss_mb"), 1), med("coverage"), int(med("missing")),
                  int(med("wrong_status")),
                  int(med("duplicates")), int(med("duplicate_responses")),
                  int(med("disallowed_fetched")), int(med("nofollow_only_fetched")),
                  int(med("out_of_scope_fetched")), int(med("other_extra")),
                  max(r.returncode for r in rs), any(r.timed_out for r in rs),
                  round(med("cpu_util"), 2), round(med("load"), 2), {})


def ratios(c: Result, s: Result) -> dict[str, float]:
    def ratio(a: float, b: float) -> float:
        return round(a / b, 3) if b else float("nan")

    return {"pages_per_s": ratio(c.pages_per_s, s.pages_per_s),
            "cpu_ms_per_page": ratio(c.cpu_ms_per_page, s.cpu_ms_per_page),
            "peak_rss": ratio(c.peak_rss_mb, s.peak_rss_mb),
            "coverage": ratio(c.coverage, s.coverage)}


# ---------------------------------------------------------------------------------------------
# machine


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def machine() -> dict[str, Any]:
    cpu = "?"
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with open("/proc/meminfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    return {"nproc": os.cpu_count(), "cpu": cpu, "ram_gib": round(mem_kb / 1024 / 1024, 1),
            "python": platform.python_version(), "kernel": platform.release(),
            "nginx": nginx_mod.nginx_version()}


# ---------------------------------------------------------------------------------------------
# modes


def bench_throughput(args: argparse.Namespace, tools: list[str], work: Path,
                     report: dict[str, Any]) -> None:
    params = synth.Params(args.origins, args.pages, args.seed, args.base_port)
    t0 = time.monotonic()
    site_dir, manifest = synth.load_or_generate(params, CACHE / "sites")
    report["site"] = {"dir": str(site_dir), "required_by_kind": manifest["required_by_kind"],
                      "must_not_fetch": {k: len(v) for k, v in
                                         manifest["must_not_fetch"].items()},
                      "ready_s": round(time.monotonic() - t0, 1)}
    print(f"site: {report['site']}", flush=True)
    seeds = list(manifest["seeds"])
    results: list[Result] = []
    with nginx_mod.Nginx(site_dir, args.origins, args.base_port):
        for rnd in range(1, args.rounds + 1):
            order = tools if rnd % 2 else list(reversed(tools))
            for tool in order:
                tag = f"{tool}-r{rnd}"
                print(f"[{time.strftime('%H:%M:%S')}] {tag} ...", flush=True)
                if tool.startswith("courtly"):
                    proc, fetched = run_courtly(seeds, work, tag, args.concurrency, args.timeout,
                                                view=tool == "courtly+view")
                else:
                    proc, fetched = run_scrapy(seeds, work, tag, args.concurrency, args.timeout)
                res = score(tool, rnd, proc, fetched, manifest)
                results.append(res)
                report["results"] = [asdict(r) for r in results]  # kept if interrupted
                print(table([res]).splitlines()[-1], flush=True)
                print(f"    info: {json.dumps(res.info)[:1500]}", flush=True)
    meds = [m for m in (median_result(t, results) for t in tools) if m is not None]
    print()
    print(table(results + meds))
    report["results"] = [asdict(r) for r in results]
    report["medians"] = [asdict(m) for m in meds]
    c = next((m for m in meds if m.tool == "courtly"), None)
    s = next((m for m in meds if m.tool == "scrapy"), None)
    if c is not None and s is not None:
        report["ratios_courtly_over_scrapy"] = ratios(c, s)
        print(f"\nratios courtly/Scrapy (medians): {report['ratios_courtly_over_scrapy']}")
        print("targets: pages/s >= 10, CPU ms/page <= 0.1, same coverage")


def bench_politeness(args: argparse.Namespace, tools: list[str], work: Path,
                     report: dict[str, Any]) -> None:
    origins = int(args.politeness[0])
    delay = float(args.politeness[1])
    per_origin = args.per_origin
    params = synth.Params(origins, max(args.pages, per_origin * 4), args.seed, args.base_port)
    site_dir, manifest = synth.load_or_generate(params, CACHE / "sites")
    seeds = list(manifest["seeds"])
    budget = origins * per_origin
    ideal = origins / delay if delay else float("inf")
    concurrency = max(origins, args.concurrency)
    print(f"politeness: {origins} origins, delay {delay}s, budget {budget} actions, "
          f"concurrency {concurrency}; ideal {ideal:.2f} pages/s", flush=True)
    rows = []
    with nginx_mod.Nginx(site_dir, origins, args.base_port):
        for rnd in range(1, args.rounds + 1):
            for tool in tools if rnd % 2 else list(reversed(tools)):
                tag = f"polite-{tool}-r{rnd}"
                print(f"[{time.strftime('%H:%M:%S')}] {tag} ...", flush=True)
                if tool == "courtly":
                    proc, fetched = run_courtly(seeds, work, tag, concurrency, args.timeout,
                                                min_delay=delay, max_actions=budget)
                else:
                    proc, fetched = run_scrapy(seeds, work, tag, concurrency, args.timeout,
                                               delay=delay, max_pages=budget)
                n = sum(fetched.responses.values())
                rate = n / proc.wall if proc.wall else 0.0
                span = fetched.info.get("response_time_span") or [None, None]
                # from the first response to the last: without start-up and shutdown; each
                # origin's first request is at t0 and its k-th at t0 + (k-1)d, so the ideal here
                # is (n - H) responses in (n/H - 1) d seconds, i.e. H/d again
                steady = None
                if span[0] and span[1] and span[1] > span[0] and n > origins:
                    steady = round((n - origins) / (span[1] - span[0]), 2)
                row = {"tool": tool, "round": rnd, "responses": n, "wall_s": round(proc.wall, 2),
                       "pages_per_s": round(rate, 2), "steady_pages_per_s": steady,
                       "ideal_pages_per_s": round(ideal, 2),
                       "efficiency": round(rate / ideal, 3) if ideal else None,
                       "steady_efficiency": round(steady / ideal, 3) if steady and ideal else None,
                       "cpu_s": round(proc.cpu_user + proc.cpu_sys, 2),
                       "returncode": proc.returncode, "timed_out": proc.timed_out,
                       "info": {k: v for k, v in fetched.info.items()
                                if k in ("exit_codes", "error", "reason", "export_states")}}
                rows.append(row)
                report["politeness_rows"] = rows  # kept if interrupted
                print(json.dumps(row), flush=True)
    report["politeness"] = {"origins": origins, "delay": delay, "budget": budget,
                            "ideal_pages_per_s": ideal, "rows": rows}
    print(f"\n{'tool':>8} {'rnd':>3} {'responses':>9} {'wall s':>8} {'pages/s':>8} "
          f"{'effic.':>6} {'steady/s':>8} {'effic.':>6} {'ideal':>7}")
    for r in rows:
        print(f"{r['tool']:>8} {r['round']:>3} {r['responses']:>9} {r['wall_s']:>8} "
              f"{r['pages_per_s']:>8} {r['efficiency']!s:>6} {r['steady_pages_per_s']!s:>8} "
              f"{r['steady_efficiency']!s:>6} {r['ideal_pages_per_s']:>7}")


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--origins", type=int, default=50)
    ap.add_argument("--pages", type=int, default=1000, help="pages per origin")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--base-port", type=int, default=18001)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--lean", action="store_true",
                    help="courtly without content storage and duplicate detection (Scrapy's work)")
    ap.add_argument("--only", choices=["scrapy", "courtly"])
    ap.add_argument("--view", action="store_true",
                    help="courtly alone against courtly --serve polled every 2 s (issue 31)")
    ap.add_argument("--frontier", type=Path, metavar="DB",
                    help="courtly starts from a copy of this frontier database "
                         "(bench/.cache/frontier/frontier-N.db, built by frontier_bench.py)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per crawl")
    ap.add_argument("--politeness", nargs=2, metavar=("H", "D"),
                    help="politeness-efficiency mode: H origins, delay D seconds")
    ap.add_argument("--per-origin", type=int, default=20,
                    help="politeness mode: crawl actions per origin (budget = H * this)")
    ap.add_argument("--json", type=Path, default=CACHE / "last-results.json")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (dbs, logs)")
    args = ap.parse_args()
    global LEAN, FRONTIER
    LEAN = args.lean
    if args.frontier is not None and not args.frontier.is_file():
        raise SystemExit(f"--frontier: no database at {args.frontier} (run frontier_bench.py)")
    FRONTIER = args.frontier
    # SIGTERM unwinds like Ctrl-C, so nginx and the running crawler are stopped too
    signal.signal(signal.SIGTERM, _terminate)

    report: dict[str, Any] = {"argv": sys.argv[1:], "machine": machine(),
                              "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    tools = ["courtly", "scrapy"] if args.only is None else [args.only]
    if args.view:
        tools = ["courtly", "courtly+view"]
    if "scrapy" in tools:
        report["machine"]["scrapy"] = ensure_scrapy()
    if "courtly" in tools and not courtly_works():
        if args.only == "courtly":
            raise SystemExit(f"{COURTLY} does not work yet (crawl --help, import courtly.crawler)")
        print(f"note: {COURTLY} does not work yet: running Scrapy only", flush=True)
        tools = ["scrapy"]
    print(f"machine: {report['machine']}", flush=True)
    compile_sources()
    CACHE.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=CACHE))
    try:
        if args.politeness:
            bench_politeness(args, tools, work, report)
        else:
            bench_throughput(args, tools, work, report)
    finally:
        if args.keep:
            print(f"work dir kept: {work}")
        else:
            for f in work.iterdir():
                f.unlink()
            work.rmdir()
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))
        print(f"report: {args.json}")


if __name__ == "__main__":
    main()
