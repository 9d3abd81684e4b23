"""The page worker's CPU a page (`analyse_page`), in instructions (callgrind) or in time.

    .venv/bin/python bench/page_bench.py [--pages 1000] [--src DIR] [--files LIST] [--time ROUNDS]

The pages: the first --pages HTML files of the synthetic site (bench/.cache/sites/o20-p500-s1-*,
made by `bench/run.py --origins 20 --pages 500`; --site another), or the files listed in --files,
each with the exchange nginx would send, analysed with the crawl's defaults (no anchor texts:
the default strategy's links go through the crawler's own handlers). --src: the courtly tree to
measure (another commit's `src`; its own PageSettings and analyse_page, whatever they take).
Without --time it runs itself under callgrind twice, analysing the pages and none (the same
pages loaded, the same first page analysed before), and prints the difference a page; with
--time, the best and the median of ROUNDS timed passes.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SITES = Path(__file__).resolve().parent / ".cache" / "sites"
#: what the callgrind runs share: the page worker's environment, a fixed hash seed
ENV = {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=33554432:glibc.malloc.mmap_threshold=4194304",
       "OPENBLAS_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def load(site: Path, files: Path | None, count: int) -> list[tuple[str, bytes, bytes]]:
    """(URL, body, exchange) of the pages."""
    if files is not None:
        paths = [Path(p) for p in files.read_text().split()]
        urls = [f"http://docs.example/{i}/{p.name}" for i, p in enumerate(paths)]
    else:
        origins = json.loads((site / "manifest.json").read_text())["origins"]
        paths = sorted(site.glob("o*/**/*.html"))
        urls = []
        for path in paths:
            origin, *rest = path.relative_to(site).parts
            urls.append(origins[int(origin[1:])] + "/" + "/".join(rest))
    pages = []
    for url, path in list(zip(urls, paths, strict=True))[:count]:
        body = path.read_bytes()
        host, _, target = url.partition("://")[2].partition("/")
        request = (f"GET /{target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: courtly/0.1 "
                   "(+https://example.invalid/courtly)\r\nAccept: */*\r\n"
                   "Accept-Encoding: gzip, deflate, br\r\n\r\n").encode()
        head = (b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Fri, 27 Nov 2026 02:29:00 GMT"
                b"\r\nContent-Type: text/html\r\nContent-Length: %d\r\nLast-Modified: Fri, 27 Nov "
                b"2026 02:29:00 GMT\r\nConnection: keep-alive\r\nETag: \"6527a0c4-%x\"\r\n"
                b"Accept-Ranges: bytes\r\n\r\n" % (len(body), len(body)))
        pages.append((url, body, request + head))
    return pages


def run(args: argparse.Namespace) -> None:
    """Analyse the pages (in this process: the tree is on sys.path)."""
    from courtly.config import CrawlConfig
    from courtly.robots import product_token

    try:
        from courtly.analysis import PageSettings, analyse_page
    except ImportError:  # before the worker's side had a module of its own
        from courtly.pageworker import PageSettings, analyse_page  # type: ignore[no-redef]

    config = CrawlConfig()
    limits = config.limits
    params = inspect.signature(PageSettings).parameters
    if "min_words" in params:  # plain settings (urls.Rules)
        from courtly.urls import Rules

        dedup: tuple[object, ...] = (config.dedup.near, config.dedup.min_words,
                                     Rules.of(config.normalize))
    else:  # 59faee6 took dedup.near, later trees the [dedup] section
        dedup = (config.dedup.near if "dedup" not in params else config.dedup, config.normalize)
    settings = PageSettings(product_token(config.user_agent), limits.max_links_per_page,
                            limits.max_parse_size, *dedup, config.store_content, anchors=False)
    exchanges = "exchange" in inspect.signature(analyse_page).parameters

    def analyse(url: str, body: bytes, exchange: bytes) -> None:
        if exchanges:
            analyse_page(settings, url, body, "text/html", "", exchange)
        else:
            analyse_page(settings, url, body, "text/html", "")

    pages = load(args.site, args.files, args.pages)
    analyse(*pages[0])  # the imports (NumPy) in every run
    if args.time:
        rounds = []
        for _ in range(args.time):
            started = time.process_time()
            for page in pages:
                analyse(*page)
            rounds.append((time.process_time() - started) / len(pages) * 1e6)
        rounds.sort()
        print(f"{len(pages)} pages: {rounds[0]:.1f} µs a page "
              f"(median {rounds[len(rounds) // 2]:.1f})")
    elif not args.none:
        for page in pages:
            analyse(*page)


def callgrind(args: argparse.Namespace) -> None:
    """Instructions a page: this script under callgrind with the pages and with none."""
    env = {**os.environ, **ENV, "PYTHONPATH": str(args.src)}
    totals = []
    with tempfile.TemporaryDirectory() as tmp:
        for extra in ([], ["--none"]):
            out = Path(tmp) / "callgrind.out"
            subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                 __file__, "--run", "--pages", str(args.pages), "--site", str(args.site),
                 *(["--files", str(args.files)] if args.files else []), *extra],
                env=env, check=True, capture_output=True)
            totals.append(int(out.read_text().split("\ntotals: ")[1].split()[0]))
    pages = len(load(args.site, args.files, args.pages))
    print(f"{args.src}: {(totals[0] - totals[1]) / pages / 1000:,.1f}k instructions a page "
          f"({pages} pages)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=1000)
    ap.add_argument("--site", type=Path, default=min(SITES.glob("o20-p500-s1-*"), default=None))
    ap.add_argument("--files", type=Path, help="a file listing HTML files to analyse instead")
    ap.add_argument("--src", type=Path, default=Path(__file__).resolve().parent.parent / "src")
    ap.add_argument("--time", type=int, default=0, metavar="ROUNDS")
    ap.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--none", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run or args.time:
        if args.time:
            sys.path.insert(0, str(args.src))
        run(args)
    else:
        callgrind(args)


if __name__ == "__main__":
    main()
