"""A Scrapy spider following courtly's rules on the synthetic site; run in bench/.venv-scrapy.

Rules, as courtly's: scope = the seeds' origins (scheme+host+port); robots.txt obeyed
(ROBOTSTXT_OBEY, Protego; Crawl-delay ignored as Scrapy always does); no links taken from pages
whose meta robots says nofollow, nor from rel=nofollow anchors; fragments dropped; redirects not
followed in place (REDIRECT_ENABLED=False): the spider records the 3xx and enqueues the Location
target itself; at most one request in flight per origin (download_slot = origin,
CONCURRENT_REQUESTS_PER_DOMAIN=1), CONCURRENT_REQUESTS = the benchmark's concurrency,
DOWNLOAD_DELAY 0 (or --delay), AutoThrottle off, breadth-first order.

It counts every response by normalized URL and writes them as JSON to --out at the end.

Usage: python spider.py --seeds-file F --out OUT.json --concurrency N [--delay D] [--max-pages N]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin

import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy.http import HtmlResponse, Request, Response
from scrapy.linkextractors import LinkExtractor


def _load_site() -> Any:
    """bench/site.py (standard library only), by path: its name is shadowed by stdlib `site`."""
    spec = importlib.util.spec_from_file_location(
        "courtly_bench_site", Path(__file__).resolve().parent.parent / "site.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_site = _load_site()
normalize, origin_of = _site.normalize, _site.origin_of


class BenchSpider(scrapy.Spider):
    name = "courtly-bench"
    handle_httpstatus_list = [301, 302, 303, 307, 308, 404, 410]  # noqa: RUF012 - Scrapy API

    def __init__(self, seeds: list[str], out: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seeds = seeds
        self.out = out
        self.origins = {origin_of(s) for s in seeds}
        self.extractor = LinkExtractor(tags=("a", "area"), attrs=("href",), unique=True)
        self.fetched: dict[str, list[int]] = {}  # url -> [count, last status]
        self.errors: dict[str, str] = {}
        self.started = time.time()
        self.first_response = 0.0
        self.last_response = 0.0

    def request(self, url: str) -> Request | None:
        url, _ = urldefrag(url)
        origin = origin_of(url)
        if origin not in self.origins:
            return None
        return Request(url, callback=self.parse, errback=self.on_error,
                       meta={"download_slot": origin})

    async def start(self) -> AsyncIterator[Any]:
        for seed in self.seeds:
            req = self.request(seed)
            if req is not None:
                yield req

    def record(self, url: str, status: int) -> None:
        self.last_response = time.time()
        if not self.first_response:
            self.first_response = self.last_response
        entry = self.fetched.setdefault(normalize(url), [0, status])
        entry[0] += 1
        entry[1] = status

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Request]:
        self.record(response.url, response.status)
        if 300 <= response.status < 400:
            location = response.headers.get("Location")
            if location:
                req = self.request(urljoin(response.url, location.decode("latin-1")))
                if req is not None:
                    yield req
            return
        if response.status >= 400 or not isinstance(response, HtmlResponse):
            return
        robots = " ".join(response.xpath('//meta[@name="robots"]/@content').getall()).lower()
        if "nofollow" in robots or "none" in robots:
            return
        for link in self.extractor.extract_links(response):
            if link.nofollow:
                continue
            req = self.request(link.url)
            if req is not None:
                yield req

    def on_error(self, failure: Any) -> None:
        request = getattr(failure, "request", None)
        url = request.url if request is not None else "?"
        response = getattr(failure.value, "response", None)
        if response is not None:  # HttpError: a status outside handle_httpstatus_list
            self.record(response.url, response.status)
        else:
            self.errors[normalize(url)] = repr(failure.value)[:200]

    def closed(self, reason: str) -> None:
        with open(self.out, "w", encoding="utf-8") as fh:
            json.dump({"reason": reason, "scrapy_version": scrapy.__version__,
                       "started": self.started, "ended": time.time(),
                       "first_response": self.first_response,
                       "last_response": self.last_response,
                       "fetched": self.fetched, "errors": self.errors}, fh)


def settings(concurrency: int, delay: float, max_pages: int) -> dict[str, Any]:
    return {
        "BOT_NAME": "courtly-bench",
        "USER_AGENT": "courtly-bench-scrapy",
        "ROBOTSTXT_OBEY": True,
        "CONCURRENT_REQUESTS": concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,  # per download slot = per origin, as courtly
        # robots.txt requests carry no download_slot, so they share the host's slot
        # "127.0.0.1" (every origin here): don't let that slot serialize or delay them
        "DOWNLOAD_SLOTS": {"127.0.0.1": {"concurrency": concurrency, "delay": 0}},
        "DOWNLOAD_DELAY": delay,
        "RANDOMIZE_DOWNLOAD_DELAY": False,
        "AUTOTHROTTLE_ENABLED": False,
        "REDIRECT_ENABLED": False,
        "METAREFRESH_ENABLED": False,
        "COOKIES_ENABLED": False,
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
        "LOG_LEVEL": "INFO",
        # breadth-first, like courtly's default strategy; the broad-crawl queue of Scrapy's docs
        "DEPTH_PRIORITY": 1,
        "SCHEDULER_DISK_QUEUE": "scrapy.squeues.PickleFifoDiskQueue",
        "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
        "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.DownloaderAwarePriorityQueue",
        "CLOSESPIDER_PAGECOUNT": max_pages,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds-file", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--max-pages", type=int, default=0)
    args = ap.parse_args()
    with open(args.seeds_file, encoding="utf-8") as fh:
        seeds = [line.strip() for line in fh if line.strip()]
    process = CrawlerProcess(settings(args.concurrency, args.delay, args.max_pages))
    process.crawl(BenchSpider, seeds=seeds, out=args.out)
    process.start()


if __name__ == "__main__":
    main()
