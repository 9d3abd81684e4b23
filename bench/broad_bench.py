"""Broad-crawl benchmark (issue 29): many origins, a few pages each, a delay of seconds per origin.

    .venv/bin/python bench/broad_bench.py --origins 2000           # Linux, as root
    .venv/bin/python bench/broad_bench.py --origins 30000 --profile # + py-spy of the crawl
    .venv/bin/python bench/broad_bench.py --origins 2000 --nofile 1024

Each origin is `http://127.a.b.c/`, an address of its own on the loopback network. The benchmark
re-executes itself under `unshare -n`: a private network namespace whose only interface is `lo`
(checked before anything starts), so no packet can leave 127.0.0.0/8. There one nginx listens on
0.0.0.0:80 and serves every address from `root SITE/$host`. The site (generated once, cached in
bench/.cache/broad/) is N origins × P pages of templated HTML: one of a few shared boilerplates
(header, navigation, footer) around a few KB of text of the page's own, links within the origin
(the home page links every page), three links to other origins' pages, one to a path robots.txt
disallows, one to an origin that is not a seed; a robots.txt per origin.

courtly crawls every home page (`--seeds-file`) with `--min-delay 10 --concurrency 256` (flags),
from the worktree's sources, and the benchmark reports:

- requests/s (nginx's access log: every request courtly sent, robots.txt included) over the crawl
  process's wall time, and over the span from the first request to the last, against the
  politeness bound origins / delay;
- CPU-ms per request of the crawl process and of its page worker (user + sys);
- peak RSS (VmHWM) of each;
- coverage: pages of the manifest fetched with status 200 / pages of the manifest, and any URL
  fetched that must not be (disallowed, other origins);
- politeness from the server's side: per origin, the requests sorted by start (nginx's $msec less
  $request_time), a gap violation is a request that starts less than the delay (less 5 ms of
  timer slack) after the previous one ended, an overlap one that starts before it ended;
- the crawl's exit status.

`--profile` attaches py-spy (`pip install py-spy`) to the crawl process and to its page worker
and writes collapsed stacks and the top functions by own and by total time.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import itertools
import json
import os
import random
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
CACHE = BENCH / ".cache" / "broad"
NETNS_MARK = "COURTLY_BROAD_BENCH_NETNS"
OUT_OF_SCOPE = "127.0.0.9"  # linked from every home page, never a seed
SLACK = 0.005  # seconds: the timers' resolution (nginx logs milliseconds)


sys.path.insert(0, str(BENCH))
import run as run_mod  # noqa: E402  machine(), compile_sources(), the /proc readers, nginx.py

# ---------------------------------------------------------------------------------------------
# the namespace


def enter_private_network() -> None:
    """Re-execute under `unshare -n` (once), then bring `lo` up and check it is alone."""
    if os.environ.get(NETNS_MARK) != "1":
        if not sys.platform.startswith("linux") or os.geteuid() != 0:
            raise SystemExit("broad_bench.py needs Linux and root (unshare -n, ip link)")
        unshare = shutil.which("unshare")
        if unshare is None:
            raise SystemExit("unshare not found (util-linux)")
        os.environ[NETNS_MARK] = "1"
        os.execv(unshare, [unshare, "-n", sys.executable, *sys.argv])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    names = [name for _, name in socket.if_nameindex()]
    if names != ["lo"]:
        raise SystemExit(f"not a private network namespace: interfaces {names}")


# ---------------------------------------------------------------------------------------------
# the site


def addresses(n: int) -> list[str]:
    """n loopback addresses from 127.1.0.1 on, skipping .0 and .255 in the last octet."""
    out: list[str] = []
    value = int(ipaddress.IPv4Address("127.1.0.1"))
    while len(out) < n:
        if value & 0xFF not in (0, 255):
            out.append(str(ipaddress.IPv4Address(value)))
        value += 1
    return out


def page_paths(pages: int) -> list[str]:
    """The paths of one origin: the home page, then /p/1.html …"""
    return ["/"] + [f"/p/{k}.html" for k in range(1, pages)]


SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "an", "el", "or", "ut", "ba", "de",
             "fi", "go", "hu", "je", "ki", "ly", "mo", "nu", "pe", "qua", "ri", "so", "ta", "ve",
             "wa", "xe", "yo", "ze", "st", "tr", "pl", "gr"]


def vocabulary(rng: random.Random, size: int = 20000) -> tuple[list[str], list[float]]:
    """Pseudo-words with Zipf weights: text that reads like a language to a shingle counter."""
    words = sorted({"".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))) for _ in range(size)})
    rng.shuffle(words)
    return words, [1.0 / (rank + 1) for rank in range(len(words))]


def template(rng: random.Random, words: list[str], theme: int) -> tuple[str, str]:
    """One CMS theme: the page's head-and-navigation and its footer, with {site} and {nav}."""
    blurb = " ".join(rng.choices(words[:400], k=90))
    legal = " ".join(rng.choices(words[:400], k=60))
    head = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<title>{{title}} | {{site}}</title><link rel="stylesheet" '
            f'href="/assets/theme{theme}.css"></head>\n<body class="theme-{theme}">\n'
            f'<header><h1><a href="/">{{site}}</a></h1><p class="tagline">{blurb}</p>\n'
            f'<nav>{{nav}}</nav></header>\n<main>\n')
    foot = (f'</main>\n<footer><p>{legal}</p><p>© {{site}} · <a href="/">home</a></p>'
            f'</footer>\n</body></html>\n')
    return head, foot


def generate(origins: int, pages: int, words_per_page: int, seed: int, out: Path) -> None:
    """Write the site under out/HOST/ (index.html, p/K.html, robots.txt) and out/seeds.txt."""
    rng = random.Random(seed)
    words, weights = vocabulary(rng)
    themes = [template(rng, words, t) for t in range(8)]
    hosts = addresses(origins)
    paths = page_paths(pages)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for i, host in enumerate(hosts):
        orng = random.Random(seed * 1_000_003 + i)
        head, foot = themes[i % len(themes)]
        site = " ".join(orng.choices(words[:3000], k=2)).title()
        nav = " ".join(f'<a href="{p}">{"Home" if p == "/" else words[k % 50].title()}</a>'
                       for k, p in enumerate(paths[:6]))
        (tmp / host / "p").mkdir(parents=True)
        (tmp / host / "robots.txt").write_text(
            "User-agent: *\nDisallow: /private/\n\nUser-agent: BadBot\nDisallow: /\n")
        for k, path in enumerate(paths):
            text = orng.choices(words, weights, k=words_per_page)
            paras = "".join(f"<p>{' '.join(text[j:j + 60])}.</p>\n"
                            for j in range(0, len(text), 60))
            same = paths if k == 0 else orng.sample(paths, min(3, len(paths)))
            others = [f"http://{hosts[orng.randrange(origins)]}"
                      f"{paths[orng.randrange(pages)]}" for _ in range(3)]
            links = [*same, *others, f"/private/{k}.html"]
            if k == 0:
                links.append(f"http://{OUT_OF_SCOPE}/")
            body = (head.format(title=" ".join(text[:5]).title(), site=site, nav=nav)
                    + f"<article><h2>{' '.join(text[5:12]).title()}</h2>\n{paras}</article>\n"
                    + "<aside><ul>" + "".join(f'<li><a href="{u}">{words[j % 500]}</a></li>'
                                              for j, u in enumerate(links)) + "</ul></aside>\n"
                    + foot.format(site=site))
            name = "index.html" if path == "/" else path.lstrip("/")
            (tmp / host / name).write_text(body)
    (tmp / "seeds.txt").write_text("".join(f"http://{h}/\n" for h in hosts))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def site_for(args: argparse.Namespace) -> Path:
    out = CACHE / f"o{args.origins}-p{args.pages}-w{args.words}-s{args.seed}"
    if not (out / "seeds.txt").exists():
        t0 = time.monotonic()
        print(f"generating {out.name} ...", flush=True)
        generate(args.origins, args.pages, args.words, args.seed, out)
        print(f"  generated in {time.monotonic() - t0:.0f} s", flush=True)
    return out


# ---------------------------------------------------------------------------------------------
# nginx


NGINX_CONF = """{user}worker_processes 1;
worker_rlimit_nofile 65536;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 32768; }}
http {{
{common}    log_format timing '$msec $request_time $host $status $request_uri';
    access_log {prefix}/access.log timing buffer=256k flush=1s;
    server {{
        listen 0.0.0.0:80 default_server backlog=8192;
        server_name _;
        root {site}/$host;
        location / {{ try_files $uri $uri/index.html =404; }}
    }}
}}
"""


@contextlib.contextmanager
def nginx(site: Path, prefix: Path) -> Any:
    conf = prefix / "nginx.conf"
    user = "user root root;\n" if os.geteuid() == 0 else ""
    conf.write_text(NGINX_CONF.format(user=user, prefix=prefix, site=site.resolve(),
                                      common=run_mod.nginx_mod.http_common(prefix)))
    binary = run_mod.nginx_mod.nginx_binary()
    with open(prefix / "stderr.log", "wb") as err:
        proc = subprocess.Popen([binary, "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"],
                                stdin=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.1.0.1", 80)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("nginx did not start: "
                                 + (prefix / "stderr.log").read_text(errors="replace"))
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGQUIT)  # graceful: flushes the access log
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# ---------------------------------------------------------------------------------------------
# the crawl, measured


@dataclass
class ProcStats:
    """One process of the crawl as last sampled: CPU seconds and peak RSS."""

    cpu_s: float = 0.0
    hwm_kb: int = 0


@dataclass
class Run:
    wall_s: float
    returncode: int
    timed_out: bool
    cpu_total_s: float  # os.wait4: the crawl process and the children it reaped
    crawl: ProcStats
    worker: ProcStats
    t_start: float
    profiles: list[str] = field(default_factory=list)


def py_spy() -> str:
    """py-spy beside this Python (a venv's bin) or on PATH."""
    found = shutil.which("py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}"
                                        f"{os.environ.get('PATH', '')}")
    if found is None:
        raise SystemExit("--profile needs py-spy: pip install py-spy")
    return found


def proc_cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_crawl(cmd: list[str], env: dict[str, str], log: Path, timeout: float, nofile: int,
              profile_dir: Path | None, rate: int = 50) -> Run:
    """Run the crawl in its own process group; sample each process's CPU and VmHWM every 0.2 s;
    with profile_dir, py-spy records each process of the crawl from its start."""

    def limits() -> None:
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with open(log, "wb") as out:
        start = time.monotonic()
        t_start = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=limits)
    procs: dict[int, ProcStats] = {}
    spies: dict[int, subprocess.Popen[bytes]] = {}
    timed_out, killed_at = False, 0.0
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            for p in run_mod._tree(proc.pid):
                stats = procs.setdefault(p, ProcStats())
                cpu = proc_cpu_s(p)
                if cpu is not None:
                    stats.cpu_s = cpu
                stats.hwm_kb = max(stats.hwm_kb, run_mod.vm_hwm_kb(p))
                if profile_dir is not None and p not in spies and len(spies) < 2:
                    name = "crawl" if p == proc.pid else "worker"
                    with open(profile_dir / f"{name}.err", "wb") as err:
                        spies[p] = subprocess.Popen(
                            [py_spy(), "record", "--pid", str(p), "--rate", str(rate),
                             "--nonblocking", "--format", "raw",
                             "-o", str(profile_dir / f"{name}.txt")],
                            stdout=subprocess.DEVNULL, stderr=err)
            now = time.monotonic()
            if not timed_out and now - start > timeout:
                timed_out, killed_at = True, now
                os.killpg(proc.pid, signal.SIGTERM)
            elif timed_out and now > killed_at + 30:
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.2)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        os.waitpid(proc.pid, 0)
        raise
    finally:
        for spy in spies.values():  # py-spy writes its file when its target exits
            try:
                spy.wait(timeout=60)
            except subprocess.TimeoutExpired:
                spy.send_signal(signal.SIGINT)
                spy.wait()
    wall = time.monotonic() - start
    total = usage.ru_utime + usage.ru_stime
    crawl = procs.pop(proc.pid, ProcStats())
    worker = max(procs.values(), key=lambda s: s.cpu_s, default=ProcStats())  # the page worker
    crawl.cpu_s = max(crawl.cpu_s, total - worker.cpu_s)  # the last samples lag by < 0.2 s
    return Run(round(wall, 2), os.waitstatus_to_exitcode(status), timed_out, total, crawl, worker,
               t_start, sorted(str(p) for p in profile_dir.glob("*.txt")) if profile_dir else [])


# ---------------------------------------------------------------------------------------------
# what the server saw and what the database holds


@dataclass
class Served:
    requests: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    first: float = 0.0
    last: float = 0.0
    gaps: int = 0
    violations: int = 0
    overlaps: int = 0
    min_gap_s: float | None = None
    violation_sample: list[str] = field(default_factory=list)


def read_access_log(log: Path, hosts: set[str], pages: set[str], delay: float) -> Served:
    served = Served()
    by_host: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with open(log, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) < 5:
                continue
            end, took, host, _status, uri = float(parts[0]), float(parts[1]), *parts[2:5]
            start = end - took
            served.requests += 1
            served.first = min(served.first or start, start)
            served.last = max(served.last, end)
            by_host[host].append((start, end))
            if host not in hosts:
                served.by_kind["other origin"] += 1
            elif uri == "/robots.txt":
                served.by_kind["robots.txt"] += 1
            elif uri.startswith("/private/"):
                served.by_kind["disallowed"] += 1
            elif uri in pages:
                served.by_kind["page"] += 1
            else:
                served.by_kind["other"] += 1
    for host, spans in by_host.items():
        spans.sort()
        for (_, prev_end), (start, _) in itertools.pairwise(spans):
            gap = start - prev_end
            served.gaps += 1
            served.min_gap_s = gap if served.min_gap_s is None else min(served.min_gap_s, gap)
            if gap < 0:
                served.overlaps += 1
            if gap < delay - SLACK:
                served.violations += 1
                if len(served.violation_sample) < 5:
                    served.violation_sample.append(f"{host}: {gap:.3f} s")
    if served.min_gap_s is not None:
        served.min_gap_s = round(served.min_gap_s, 3)
    return served


def read_db(db: Path, required: set[str]) -> dict[str, Any]:
    if not db.exists():
        return {"error": "no database"}
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        ok = {url for url, in con.execute("SELECT url FROM crawl_log WHERE http_status = 200")}
        codes = dict(con.execute("SELECT exit_code, count(*) FROM crawl_log GROUP BY 1"))
    finally:
        con.close()
    got = len(ok & required)
    return {"coverage": round(got / len(required), 5), "missing": len(required) - got,
            "exit_codes": codes}


# ---------------------------------------------------------------------------------------------


CONFIG = """\
progress = "{progress}"
[limits]
allow_private_addresses = true   # the web of the benchmark is on 127.0.0.0/8
{extra}"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--origins", type=int, default=2000)
    ap.add_argument("--pages", type=int, default=5, help="pages per origin, home page included")
    ap.add_argument("--words", type=int, default=400, help="words of a page's own text")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--min-delay", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--strategy", default="breadth-first", help="the crawl's --strategy")
    ap.add_argument("--nofile", type=int, default=0,
                    help="RLIMIT_NOFILE of the crawl (0: inherited), e.g. 1024")
    ap.add_argument("--config", action="append", default=[], metavar="TOML_LINE",
                    help="an extra line of the crawl's config file (repeatable)")
    ap.add_argument("--progress", default="log", choices=["log", "off"])
    ap.add_argument("--profile", action="store_true", help="py-spy the crawl and its worker")
    ap.add_argument("--profile-rate", type=int, default=50, help="py-spy samples a second")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds for the crawl")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (db, logs)")
    ap.add_argument("--json", type=Path, default=CACHE / "last-results.json")
    args = ap.parse_args()
    enter_private_network()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: nginx stopped

    site = site_for(args)
    hosts = addresses(args.origins)
    paths = page_paths(args.pages)
    required = {f"http://{h}{p}" for h in hosts for p in paths}
    run_mod.compile_sources()
    work = Path(tempfile.mkdtemp(prefix="run-", dir=CACHE))
    db = work / "crawl.db"
    (work / "crawl.toml").write_text(CONFIG.format(progress=args.progress,
                                                   extra="\n".join(args.config)))
    cmd = [sys.executable, "-m", "courtly", "crawl", "--seeds-file", str(site / "seeds.txt"),
           "--db", str(db), "--config", str(work / "crawl.toml"),
           "--min-delay", str(args.min_delay), "--concurrency", str(args.concurrency),
           "--strategy", args.strategy]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop(NETNS_MARK, None)
    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                            capture_output=True, text=True, check=False).stdout.strip()
    report: dict[str, Any] = {"argv": sys.argv[1:], "machine": run_mod.machine(),
                              "commit": commit,
                              "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                              "load1_before": run_mod.loadavg()}
    nofile = args.nofile or resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    print(f"{args.origins} origins × {args.pages} pages, delay {args.min_delay} s, concurrency "
          f"{args.concurrency}, nofile {nofile}"
          f"; bound {args.origins / args.min_delay:.0f} requests/s; work dir {work}", flush=True)
    try:
        with nginx(site, work):
            crawl = run_crawl(cmd, env, work / "crawl.log", args.timeout, args.nofile,
                              work if args.profile else None, args.profile_rate)
        served = read_access_log(work / "access.log", set(hosts), set(paths), args.min_delay)
        stored = read_db(db, required)
        bound = args.origins / args.min_delay
        span = served.last - served.first
        result = {
            "origins": args.origins, "pages": args.pages, "delay_s": args.min_delay,
            "concurrency": args.concurrency, "nofile": args.nofile,
            "bound_rps": round(bound, 1),
            "requests": served.requests, "requests_by_kind": dict(served.by_kind),
            "wall_s": crawl.wall_s,
            "rps_wall": round(served.requests / crawl.wall_s, 1),
            "rps_wall_of_bound": round(served.requests / crawl.wall_s / bound, 3),
            "first_request_after_s": round(served.first - crawl.t_start, 2) if served.first
            else None,
            "rps_span": round(served.requests / span, 1) if span > 0 else None,
            "cpu_ms_per_request": round(crawl.cpu_total_s * 1000 / max(1, served.requests), 3),
            "cpu_ms_per_request_crawl": round(crawl.crawl.cpu_s * 1000
                                              / max(1, served.requests), 3),
            "cpu_ms_per_request_worker": round(crawl.worker.cpu_s * 1000
                                               / max(1, served.requests), 3),
            "cpu_s": round(crawl.cpu_total_s, 1),
            "peak_rss_mb_crawl": round(crawl.crawl.hwm_kb / 1024, 1),
            "peak_rss_mb_worker": round(crawl.worker.hwm_kb / 1024, 1),
            **stored,
            "gap_violations": served.violations, "overlaps": served.overlaps,
            "min_gap_s": served.min_gap_s, "violation_sample": served.violation_sample,
            "returncode": crawl.returncode, "timed_out": crawl.timed_out,
            "load1_after": run_mod.loadavg(),
            "log_tail": (work / "crawl.log").read_text(errors="replace").splitlines()[-4:],
        }
        report["result"] = result
        if crawl.profiles:
            report["profile"] = {Path(p).stem: top_functions(Path(p)) for p in crawl.profiles}
        print(json.dumps(result, indent=1, ensure_ascii=False))
        for name, prof in report.get("profile", {}).items():
            for kind in ("by_own", "by_total"):
                print(f"\n{name} process, {prof['samples']} samples, % {kind.replace('_', ' ')}:")
                for func, pct in prof[kind][:25]:
                    print(f"  {pct:5.1f}  {func}")
    finally:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str, ensure_ascii=False))
        print(f"report: {args.json}")
        if args.keep or args.profile:
            print(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def frame_name(frame: str) -> str:
    """`func (path/file.py:12)` → `func file.py`."""
    name, _, where = frame.partition(" (")
    return f"{name} {where.rsplit(':', 1)[0].rsplit('/', 1)[-1]}"


def top_functions(collapsed: Path) -> dict[str, Any]:
    """py-spy's raw output (collapsed stacks) → functions by own and by total share of samples."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = [frame_name(f) for f in stack.split(";") if f]
        if not frames:
            continue
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    def share(counter: Counter[str], n: int) -> list[tuple[str, float]]:
        return [(f, round(100 * c / max(1, samples), 1)) for f, c in counter.most_common(n)]

    return {"samples": samples, "by_own": share(own, 30), "by_total": share(total, 40)}


if __name__ == "__main__":
    main()
