"""Real HTML: courtly and Scrapy crawling the Rust documentation (rustdoc and mdBook output).

Issue 32: the synthetic site's pages are 5 KB with 30 links; real documentation pages are large
(~53 KB here), templated, with hundreds of links each. This benchmark serves a tree of the Rust
documentation that rustup installs (`share/doc/rust/html` of a toolchain; MIT / Apache-2.0) with
nginx and crawls it with both crawlers in the same run, measured as bench/run.py measures them
(pages/s, CPU ms a page over the crawl process and its children, peak RSS).

The tree (PARTS): the standard library's docs (`std`) and eight books (the Rust book, cargo, the
reference, the nomicon, the edition guide, rustc, Rust by Example, the embedded book): 3,083
pages reachable from their index pages, 53 KB and 258 links a page on average, plus the links
leaving the tree (`core`, …: 404 on this server).

- `--layout one`: one origin serves the whole tree; one request at a time (at most one in flight
  per origin), the seeds are the parts' index pages.
- `--layout many`: each part is its own origin (std's modules each one, its top-level pages
  another): 30-odd origins, concurrency 16. A link from one part to another is a 404 there.

Both crawlers fetch the same URLs (the report says how many each fetched that the other did
not: must be 0). The directory: `--docs PATH`, else the first rustup toolchain's.

    .venv/bin/python bench/real_html.py [--layout one|many|both] [--rounds 1] [--only courtly]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


sys.path.insert(0, str(BENCH))
import run  # noqa: E402  (bench/run.py: the driver, its loaders of site.py and nginx.py)

nginx_mod = run.nginx_mod

BOOKS = ("book", "cargo", "reference", "nomicon", "edition-guide", "rustc", "rust-by-example",
         "embedded-book")
SITES = run.CACHE / "real-html"


def find_docs(given: Path | None) -> Path:
    """The html directory of the Rust docs: given, or the first rustup toolchain's."""
    if given is not None:
        if not (given / "std" / "index.html").is_file():
            raise SystemExit(f"--docs: no Rust documentation at {given} (std/index.html)")
        return given
    for home in (Path.home(), Path("/root")):
        for html in sorted((home / ".rustup" / "toolchains").glob("*/share/doc/rust/html")):
            if (html / "std" / "index.html").is_file():
                return html
    raise SystemExit("no Rust documentation found (rustup component add rust-docs), or give "
                     "--docs PATH/share/doc/rust/html")


def parts(docs: Path) -> list[list[str]]:
    """The tree as parts (paths relative to docs/): each book; std's modules; std's own pages."""
    out = [[book] for book in BOOKS if (docs / book).is_dir()]
    std = docs / "std"
    out += [[f"std/{d.name}"] for d in sorted(std.iterdir()) if d.is_dir()]
    out.append(sorted(f"std/{f.name}" for f in std.glob("*.html")))
    return out


def build(docs: Path, layout: str) -> tuple[Path, list[str], int]:
    """The site directory (o0, o1, … of symbolic links into docs), the seed paths per origin,
    the number of origins."""
    site = SITES / layout
    groups = parts(docs)
    origins = [[path for group in groups for path in group]] if layout == "one" else groups
    if site.exists():
        shutil.rmtree(site)
    seeds: list[str] = []
    for i, paths in enumerate(origins):
        for rel in paths:
            link = site / f"o{i}" / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(docs / rel)
        tops = sorted({p if not p.endswith(".html") else p.rsplit("/", 1)[0] for p in paths})
        seeds += [f"{i}:/{top}/index.html" for top in tops]
    return site, seeds, len(origins)


def result(tool: str, rnd: int, proc: Any, fetched: Any) -> dict[str, Any]:
    urls = fetched.responses
    pages = len(urls)
    cpu = proc.cpu_user + proc.cpu_sys
    return {"tool": tool, "round": rnd, "wall_s": round(proc.wall, 2), "pages": pages,
            "ok_pages": sum(1 for u in urls if fetched.statuses.get(u) == 200),
            "pages_per_s": round(pages / proc.wall, 1) if proc.wall else 0.0,
            "cpu_ms_per_page": round(cpu * 1000 / pages, 3) if pages else float("nan"),
            "peak_rss_mb": round(proc.maxrss_kb / 1024, 1),
            "duplicate_fetches": sum(n - 1 for n in urls.values() if n > 1),
            "cpu_util": round(cpu / proc.wall, 2) if proc.wall else 0.0,
            "load1": run.loadavg(), "rc": "T/O" if proc.timed_out else proc.returncode}


COLUMNS = ("tool", "round", "wall_s", "pages", "ok_pages", "pages_per_s", "cpu_ms_per_page",
           "peak_rss_mb", "duplicate_fetches", "cpu_util", "load1", "rc")


def show(rows: list[dict[str, Any]]) -> str:
    lines = [" ".join(f"{c:>17}" for c in COLUMNS)]
    lines += [" ".join(f"{r.get(c, '')!s:>17}" for c in COLUMNS) for r in rows]
    return "\n".join(lines)


def bench(args: argparse.Namespace, docs: Path, layout: str, tools: list[str], work: Path,
          report: dict[str, Any]) -> None:
    site, seed_paths, origins = build(docs, layout)
    seeds = [f"http://127.0.0.1:{args.base_port + int(i)}{path}"
             for i, path in (s.split(":", 1) for s in seed_paths)]
    concurrency = 1 if origins == 1 else args.concurrency
    print(f"{layout}: {origins} origin(s), {len(seeds)} seeds, concurrency {concurrency}",
          flush=True)
    rows: list[dict[str, Any]] = []
    sets: dict[str, set[str]] = {}
    with nginx_mod.Nginx(site, origins, args.base_port):
        for rnd in range(1, args.rounds + 1):
            for tool in tools if rnd % 2 else list(reversed(tools)):
                tag = f"{layout}-{tool}-r{rnd}"
                print(f"[{time.strftime('%H:%M:%S')}] {tag} ...", flush=True)
                if tool == "courtly":
                    proc, fetched = run.run_courtly(seeds, work, tag, concurrency, args.timeout)
                else:
                    proc, fetched = run.run_scrapy(seeds, work, tag, concurrency, args.timeout)
                row = result(tool, rnd, proc, fetched)
                rows.append(row)
                sets[tool] = set(fetched.responses)
                print(show([row]).splitlines()[-1], flush=True)
    meds = []
    for tool in tools:
        mine = [r for r in rows if r["tool"] == tool]
        meds.append({"tool": tool, "round": "med", **{
            k: statistics.median(r[k] for r in mine)
            for k in ("wall_s", "pages", "ok_pages", "pages_per_s", "cpu_ms_per_page",
                      "peak_rss_mb", "duplicate_fetches", "cpu_util", "load1")}})
    print(show(rows + meds))
    out: dict[str, Any] = {"origins": origins, "seeds": len(seeds), "concurrency": concurrency,
                           "rows": rows, "medians": meds}
    if len(meds) == 2:
        c, s = meds
        out["ratios"] = {k: round(c[k] / s[k], 3) for k in ("pages_per_s", "cpu_ms_per_page",
                                                           "peak_rss_mb")}
        out["only_courtly"] = sorted(sets["courtly"] - sets["scrapy"])[:20]
        out["only_scrapy"] = sorted(sets["scrapy"] - sets["courtly"])[:20]
        print(f"ratios courtly/Scrapy (medians): {out['ratios']}; URLs fetched by one only: "
              f"courtly {len(sets['courtly'] - sets['scrapy'])}, "
              f"Scrapy {len(sets['scrapy'] - sets['courtly'])}")
    report[layout] = out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=Path, help="the Rust docs' html directory")
    ap.add_argument("--layout", choices=["one", "many", "both"], default="both")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only", choices=["scrapy", "courtly"])
    ap.add_argument("--concurrency", type=int, default=16, help="with many origins")
    ap.add_argument("--base-port", type=int, default=18101)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per crawl")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (dbs, logs)")
    ap.add_argument("--json", type=Path, default=run.CACHE / "real-html-results.json")
    args = ap.parse_args()
    docs = find_docs(args.docs)
    tools = ["courtly", "scrapy"] if args.only is None else [args.only]
    report: dict[str, Any] = {"argv": sys.argv[1:], "docs": str(docs), "machine": run.machine(),
                              "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    if "scrapy" in tools:
        report["machine"]["scrapy"] = run.ensure_scrapy()
    print(f"docs: {docs}\nmachine: {report['machine']}", flush=True)
    run.compile_sources()
    run.CACHE.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="real-", dir=run.CACHE))
    try:
        for layout in ("one", "many") if args.layout == "both" else (args.layout,):
            bench(args, docs, layout, tools, work, report)
    finally:
        if args.keep:
            print(f"work dir kept: {work}")
        else:
            shutil.rmtree(work)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))
        print(f"report: {args.json}")


if __name__ == "__main__":
    main()
