"""Whether two courtly trees' `analyse_page` give the same results, byte for byte, on bench pages.

    .venv/bin/python bench/page_check.py --old OLD_SRC [--new SRC] [--files LIST] [--pages N]

Each tree analyses the same pages in its own process (PYTHONPATH: its `src`): the synthetic site's
(bench/page_bench.py's, all of them unless --pages) and the files listed in --files, with the
crawl's defaults, with and without anchor texts, then with the page as its own (`own`) and a Link
header. Each analysis's fields are pickled; the script prints the pages whose results differ
(the first few) and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import page_bench  # noqa: E402


def digests(args: argparse.Namespace) -> None:
    """In the tree under test: one line a page and settings, its URL and its results' digest."""
    from courtly.analysis import PageSettings, analyse_page, astuple
    from courtly.config import CrawlConfig
    from courtly.robots import product_token
    from courtly.urls import Rules

    config = CrawlConfig()
    limits, dedup = config.limits, config.dedup
    pages = page_bench.load(args.site, None, args.pages)
    if args.files:
        pages += page_bench.load(args.site, args.files, 1 << 30)
    for anchors in (False, True):
        settings = PageSettings(product_token(config.user_agent), limits.max_links_per_page,
                                limits.max_parse_size, dedup.near, dedup.min_words,
                                Rules.of(config.normalize), config.store_content, anchors)
        for url, body, exchange in pages:
            for extra in ((), ("<https://other.example/>; rel=canonical", True)):
                page = analyse_page(settings, url, body, "text/html", "", exchange, *extra)
                digest = hashlib.sha256(pickle.dumps(astuple(page), protocol=5)).hexdigest()
                print(anchors, bool(extra), url, digest)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="the `src` of the tree before")
    ap.add_argument("--new", type=Path, default=BENCH.parent / "src")
    ap.add_argument("--files", type=Path, help="a file listing HTML files to analyse too")
    ap.add_argument("--pages", type=int, default=1 << 30)
    ap.add_argument("--site", type=Path, default=min(page_bench.SITES.glob("o20-p500-s1-*"),
                                                     default=None))
    ap.add_argument("--digests", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.digests:
        digests(args)
        return
    outputs = []
    for src in (args.old, args.new):
        cmd = [sys.executable, __file__, "--digests", "--old", str(args.old), "--site",
               str(args.site), "--pages", str(args.pages),
               *(["--files", str(args.files)] if args.files else [])]
        env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
        outputs.append(subprocess.run(cmd, env=env, check=True, capture_output=True,
                                      text=True).stdout.splitlines())
    old, new = outputs
    differ = [a.rsplit(" ", 1)[0] for a, b in zip(old, new, strict=True) if a != b]
    print(f"{len(old)} analyses, {len(differ)} different")
    for line in differ[:10]:
        print("  ", line)
    sys.exit(1 if differ or not old else 0)


if __name__ == "__main__":
    main()
