"""`courtly demo`: a bundled three-origin site on 127.0.0.1, crawled into a fresh database."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

from courtly.site import LocalSite, Page, html
from courtly.store.sqlite import read_only


class DemoError(Exception):
    """The demo cannot run as asked (its --port or --db); the message is one line."""


ROBOTS = "User-agent: *\nDisallow: /private/\nCrawl-delay: 0.05\n"


def demo_sites() -> dict[str, dict[str, Page]]:
    """News, shop and blog: links, a redirect, canonical, noindex, nofollow, robots, a PDF."""
    news: dict[str, Page] = {
        "/robots.txt": Page(ROBOTS, headers={"Content-Type": "text/plain"}),
        "/": Page(html("News", ["/world", "/sport", "/old-home", "/private/x", "/report.pdf",
                                "/print/world", "/secret", "/links"])),
        "/world": Page(html("World", ["/", "/sport", "/world#top"])),
        "/sport": Page(html("Sport", ["/", "/world?b=2&a=1"])),
        "/world?a=1&b=2": Page(html("World, sorted query", ["/"])),
        "/old-home": Page("", 301, {"Location": "/"}),
        "/print/world": Page(html("World (print)", [], '<link rel="canonical" href="/world">')),
        "/secret": Page(
            html("Secret", ["/secret-child"], '<meta name="robots" content="noindex">')
        ),
        "/secret-child": Page(html("Secret child", [])),
        "/links": Page(html("Links", ["/unfollowed"], '<meta name="robots" content="nofollow">')),
        "/private/x": Page(html("Private", [])),
        "/report.pdf": Page(b"%PDF-1.4 demo", headers={"Content-Type": "application/pdf"}),
    }
    shop = {
        "/robots.txt": Page("User-agent: *\nAllow: /\n", headers={"Content-Type": "text/plain"}),
        "/": Page(html("Shop", [f"/item/{i}" for i in range(1, 6)] + ["/gone"])),
        **{f"/item/{i}": Page(html(f"Item {i}", ["/", f"/item/{i % 5 + 1}"])) for i in range(1, 6)},
    }
    blog = {"/": Page(html("Blog", ["/post/1", "/post/2"])),
            "/post/1": Page(html("Post 1", ["/", "/post/2"])),
            "/post/2": Page(html("Post 2", ["/", "/post/1"]))}
    return {"news": news, "shop": shop, "blog": blog}


def run_demo(port: int, db: str) -> int:
    """Serve the demo site, crawl it with `courtly crawl`, then show `courtly stats`."""
    sites = demo_sites()
    last = 65536 - len(sites)
    if port and not 0 < port <= last:
        raise DemoError(f"--port must be 0 (any free ports) or 1-{last} (the demo's first port)")
    _check_replaceable(db)
    with ExitStack() as stack:
        try:
            site = stack.enter_context(LocalSite(sites, port))
        except OSError as exc:
            raise DemoError(f"cannot serve the demo site: {exc.strerror or exc}") from None
        for suffix in ("", "-wal", "-shm"):
            Path(db + suffix).unlink(missing_ok=True)
        news, shop, blog = (site.url(n) for n in ("news", "shop", "blog"))
        # the shop and the blog link to each other and to the news site
        shop_home = sites["shop"]["/"]
        assert isinstance(shop_home.body, str)
        shop_home.body = shop_home.body.replace("</body>", f'<a href="{blog}">blog</a></body>')
        print(f"demo site: {news} {shop} {blog}", flush=True)
        command = [sys.executable, "-m", "courtly", "crawl", news, shop, blog, "--db", db,
                   "--min-delay", "0.05", "--progress", "log"]
        print("$ courtly crawl", " ".join(command[4:]), flush=True)
        status = subprocess.call(command, env=os.environ.copy())
        if status != 0:
            return status
    print(f"$ courtly stats --db {db}", flush=True)
    return subprocess.call([sys.executable, "-m", "courtly", "stats", "--db", db])


def _check_replaceable(db: str) -> None:
    """The demo starts afresh: it may delete its own database, never another file."""
    path = Path(db)
    if path.is_dir():
        raise DemoError(f"--db {db} is a directory")
    if path.exists() and not _written_by_demo(path):
        raise DemoError(f"--db {db} is not a demo crawl database: it is left alone")


def _written_by_demo(path: Path) -> bool:
    """Whether the file is a crawl database of the demo's site: its origins on 127.0.0.1, no
    more of them than the demo serves, and no URL the demo's pages do not serve or link to (a
    crawl of the user's own local site is left alone)."""
    try:
        with read_only(path) as con:
            con.execute("SELECT version FROM schema_version")
            origins = [origin for (origin,) in con.execute("SELECT origin FROM origins")]
            urls = [url for (url,) in con.execute("SELECT url FROM candidates")]
    except sqlite3.DatabaseError:
        return False
    sites = demo_sites()
    known = {path for pages in sites.values() for path in _served_or_linked(pages)}
    return (len(origins) <= len(sites) and all(o.startswith("http://127.0.0.1:") for o in origins)
            and all(_path_of(url) in known for url in urls))


def _served_or_linked(pages: dict[str, Page]) -> set[str]:
    """The paths a demo origin serves, and those its pages link to (fragments cut)."""
    linked = {href.partition("#")[0] for page in pages.values() if isinstance(page.body, str)
              for href in re.findall(r'href="(/[^"]*)"', page.body)}
    return set(pages) | linked


def _path_of(url: str) -> str:
    """A URL's path and query, as the demo's pages name them."""
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")
