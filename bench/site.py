"""A deterministic synthetic multi-origin web, written as static files, plus its manifest.

Each origin is one loopback port (127.0.0.1:BASE_PORT+i) served by nginx (bench/nginx.py) from
``DIR/o{i}/``.  Per origin:

- ``/`` (index.html) and ``/p/{n}.html`` for n < pages: ordinary pages, ~30 links each;
- ``/hidden/{k}.html``: linked only from nofollow pages and from ``rel=nofollow`` anchors;
- ``/private/{k}.html``: files exist, but robots.txt disallows ``/private/``;
- ``/r/{k}.html`` (301 → ``/p/{k}.html``) and ``/rr/{k}.html`` (301 → ``/r/{k}.html``):
  redirects, done by nginx ``return 301``;
- ``/missing/{k}.html``: linked, no file, so 404;
- ``robots.txt`` with ``Disallow`` lines and ``Crawl-delay: 5`` (the benchmark neutralises it:
  courtly runs with ``[politeness] max_crawl_delay = 0``, which clamps it to 0; Scrapy ignores it).

Links mix forms (relative ``n.html``, ``./n.html``, ``../p/n.html``, absolute path, absolute URL),
fragments, query strings in two orders (``?a=1&b=2`` / ``?b=2&a=1``, one URL once normalized),
other origins, an unserved out-of-scope origin (BASE_PORT-1), ``mailto:`` links.  A few pages are
``noindex``, ``nofollow``, ``noindex,nofollow`` or carry a ``rel=canonical`` to another page.

The manifest (``manifest.json``) lists the URLs a correct crawl must fetch, with their kind
(``page`` 200, ``redirect`` 301, ``not_found`` 404): reachable from the seeds (the origins' ``/``)
through followable links (not in a nofollow page, not ``rel=nofollow``), in scope (a seed origin),
not disallowed; a redirect's source counts as fetched and its target is reached.  Links on
noindex and non-canonical pages are followed.  It also lists URLs a correct crawl must NOT fetch:
disallowed ones, nofollow-only ones and out-of-scope ones.

Usage: python bench/site.py DIR [--origins 50] [--pages 1000] [--seed 1] [--base-port 18001]
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import random
import shutil
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

MANIFEST = "manifest.json"
GENERATOR_VERSION = 4
ROBOTS_DISALLOW = ("/private/", "/cgi-bin/")
CRAWL_DELAY = 5


def normalize(url: str) -> str:
    """The comparison form of a URL: lower-case scheme and host, no default port, no fragment,
    query pairs sorted.  Both crawlers agree with it on this site's URLs."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    port = parts.port
    netloc = host
    if port is not None and not (
        (scheme == "http" and port == 80) or (scheme == "https" and port == 443)
    ):
        netloc = f"{host}:{port}"
    query = urlencode(sorted(parse_qsl(parts.query, keep_blank_values=True)))
    return urlunsplit((scheme, netloc, parts.path or "/", query, ""))


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@dataclass
class Params:
    origins: int = 50
    pages: int = 1000
    seed: int = 1
    base_port: int = 18001

    def key(self) -> str:
        raw = f"v{GENERATOR_VERSION}-{self.origins}-{self.pages}-{self.seed}-{self.base_port}"
        return f"o{self.origins}-p{self.pages}-s{self.seed}-" + hashlib.sha1(
            raw.encode()
        ).hexdigest()[:8]

    def port(self, i: int) -> int:
        return self.base_port + i

    def origin(self, i: int) -> str:
        return f"http://127.0.0.1:{self.port(i)}"

    @property
    def out_of_scope_origin(self) -> str:
        return f"http://127.0.0.1:{self.base_port - 1}"

    @property
    def n_small(self) -> int:
        """How many hidden / private / redirect / missing URLs an origin has."""
        return max(2, self.pages // 50)

    @property
    def n_query(self) -> int:
        """How many pages get query-string links (bounds the URL universe)."""
        return max(2, self.pages // 50)


@dataclass
class Page:
    path: str
    robots: str = ""  # meta robots content
    canonical: str | None = None
    links: list[tuple[str, bool]] = field(default_factory=list)  # (href, rel_nofollow)


_WORDS: list[str] = []


def _vocab() -> list[str]:
    if not _WORDS:
        rng = random.Random(12345)
        letters = "abcdefghijklmnopqrstuvwxyz"
        for _ in range(3000):
            _WORDS.append("".join(rng.choice(letters) for _ in range(rng.randint(3, 10))))
    return _WORDS


def _text(rng: random.Random, n_words: int) -> str:
    words = _vocab()
    return " ".join(rng.choice(words) for _ in range(n_words))


def _page_link(rng: random.Random, origin: str, n: int, from_root: bool = False) -> str:
    """A link from a /p/ page (or the root page) to /p/{n}.html, in one of several forms."""
    form = rng.randrange(3, 6) if from_root else rng.randrange(6)
    if form == 0:
        return f"{n}.html"
    if form == 1:
        return f"./{n}.html"
    if form == 2:
        return f"../p/{n}.html"
    if form == 3:
        return f"/p/{n}.html"
    if form == 4:
        return f"{origin}/p/{n}.html"
    return f"/p/{n}.html#s{rng.randrange(5)}"


def build_origin(params: Params, i: int) -> dict[str, Page]:
    """The pages of origin i (path → Page); deterministic in (params, i)."""
    rng = random.Random(f"{params.seed}-{i}")
    origin = params.origin(i)
    n_pages = params.pages
    small = params.n_small
    pages: dict[str, Page] = {}

    def flags() -> tuple[str, str | None]:
        r = rng.random()
        if r < 0.03:
            return "noindex", None
        if r < 0.06:
            return "nofollow", None
        if r < 0.08:
            return "noindex, nofollow", None
        if r < 0.11:
            return "", f"{origin}/p/{rng.randrange(n_pages)}.html"
        return "", None

    def common_links(page: Page) -> None:
        # tree links guarantee reachability; random ones make the graph dense
        root = page.path == "/"
        for _ in range(16):
            page.links.append((_page_link(rng, origin, rng.randrange(n_pages), root), False))
        for _ in range(2):
            q = rng.randrange(params.n_query)
            query = "a=1&b=2" if rng.random() < 0.5 else "b=2&a=1"
            page.links.append((f"/p/{q}.html?{query}", False))
        others = [j for j in range(params.origins) if j != i]
        for _ in range(3 if others else 0):
            j = rng.choice(others)
            page.links.append((f"{params.origin(j)}/p/{rng.randrange(n_pages)}.html", False))
        page.links.append((f"/private/{rng.randrange(small)}.html", False))
        if rng.random() < 0.1:
            page.links.append(("/cgi-bin/search?q=x", False))
        kind = "rr" if rng.random() < 0.3 else "r"
        page.links.append((f"/{kind}/{rng.randrange(small)}.html", False))
        page.links.append((f"/missing/{rng.randrange(small)}.html", False))
        if rng.random() < 0.2:
            page.links.append((f"{params.out_of_scope_origin}/p/{rng.randrange(n_pages)}.html",
                               False))
        if rng.random() < 0.1:
            page.links.append((f"/hidden/{rng.randrange(small)}.html", True))
        if rng.random() < 0.1:
            page.links.append(("mailto:webmaster@example.invalid", False))
        page.links.append(("/", False))

    home = Page("/")
    home.links.append(("/p/0.html", False))
    home.links.append(("p/1.html", False))
    common_links(home)
    pages["/"] = home
    for n in range(n_pages):
        page = Page(f"/p/{n}.html")
        if n > 1:
            page.robots, page.canonical = flags()
        for child in (2 * n + 1, 2 * n + 2):
            if child < n_pages:
                page.links.append((f"{child}.html", False))
        common_links(page)
        if "nofollow" in page.robots:
            page.links.append((f"/hidden/{rng.randrange(small)}.html", False))
        rng.shuffle(page.links)
        pages[page.path] = page
    for kind in ("hidden", "private"):
        for k in range(small):
            page = Page(f"/{kind}/{k}.html")
            for _ in range(5):
                page.links.append((_page_link(rng, origin, rng.randrange(n_pages)), False))
            pages[page.path] = page
    return pages


def redirect_target(path: str) -> str | None:
    """Where nginx redirects a path (same origin), or None."""
    for prefix, to in (("/r/", "/p/"), ("/rr/", "/r/")):
        if path.startswith(prefix) and path.endswith(".html"):
            return to + path[len(prefix):]
    return None


def render(page: Page, rng: random.Random) -> str:
    head = [f"<title>{_text(rng, 4)}</title>", '<meta charset="utf-8">']
    if page.robots:
        head.append(f'<meta name="robots" content="{page.robots}">')
    if page.canonical:
        head.append(f'<link rel="canonical" href="{html.escape(page.canonical)}">')
    body = [f"<h1>{_text(rng, 5)}</h1>"]
    for href, nofollow in page.links:
        rel = ' rel="nofollow"' if nofollow else ""
        a = f'<a href="{html.escape(href)}"{rel}>{_text(rng, 3)}</a>'
        body.append(f"<p>{_text(rng, 12)} {a}</p>")
    body.append(f"<p>{_text(rng, 120)}</p>")
    return (
        "<!DOCTYPE html>\n<html><head>" + "".join(head) + "</head>\n<body>\n"
        + "\n".join(body) + "\n</body></html>\n"
    )


def robots_txt() -> str:
    lines = ["User-agent: *"]
    lines += [f"Disallow: {p}" for p in ROBOTS_DISALLOW]
    lines.append(f"Crawl-delay: {CRAWL_DELAY}")
    return "\n".join(lines) + "\n"


def compute_manifest(params: Params, sites: list[dict[str, Page]]) -> dict[str, object]:
    """BFS over the followable link graph from the seeds."""
    origins = {params.origin(i): i for i in range(params.origins)}
    required: dict[str, str] = {}
    disallowed: set[str] = set()
    out_of_scope: set[str] = set()
    nofollow_only: set[str] = set()
    rel_nofollow_targets: set[str] = set()
    seeds = [normalize(params.origin(i) + "/") for i in range(params.origins)]
    queue: deque[str] = deque(seeds)
    seen: set[str] = set(seeds)

    def consider(url: str) -> None:
        if url in seen:
            return
        o = origin_of(url)
        if o not in origins:
            out_of_scope.add(url)
            return
        path = urlsplit(url).path
        if any(path.startswith(p) for p in ROBOTS_DISALLOW):
            disallowed.add(url)
            return
        seen.add(url)
        queue.append(url)

    while queue:
        url = queue.popleft()
        parts = urlsplit(url)
        site = sites[origins[origin_of(url)]]
        target = redirect_target(parts.path)
        if target is not None:
            required[url] = "redirect"
            consider(normalize(urljoin(url, target)))
            continue
        page = site.get(parts.path)
        if page is None:
            required[url] = "not_found"
            continue
        required[url] = "page"
        if "nofollow" in page.robots:
            for href, _ in page.links:
                if not href.startswith("mailto:"):
                    nofollow_only.add(normalize(urljoin(url, href)))
            continue
        for href, rel_nofollow in page.links:
            if href.startswith("mailto:"):
                continue
            target_url = normalize(urljoin(url, href))
            if rel_nofollow:
                rel_nofollow_targets.add(target_url)
                continue
            consider(target_url)
    nofollow_only |= rel_nofollow_targets
    nofollow_only -= set(required)
    nofollow_only -= disallowed
    nofollow_only = {u for u in nofollow_only if origin_of(u) in origins}
    kinds: dict[str, int] = {}
    for kind in required.values():
        kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "generator_version": GENERATOR_VERSION,
        "params": params.__dict__,
        "origins": list(origins),
        "seeds": seeds,
        "required": dict(sorted(required.items())),
        "required_by_kind": kinds,
        "must_not_fetch": {
            "disallowed": sorted(disallowed),
            "nofollow_only": sorted(nofollow_only),
            "out_of_scope": sorted(out_of_scope),
        },
        "robots_disallow": list(ROBOTS_DISALLOW),
        "crawl_delay": CRAWL_DELAY,
    }


def generate(params: Params, directory: Path) -> dict[str, object]:
    """Write the site into directory (replacing it) and return the manifest."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    sites = [build_origin(params, i) for i in range(params.origins)]
    for i, site in enumerate(sites):
        root = directory / f"o{i}"
        for sub in ("p", "hidden", "private"):
            (root / sub).mkdir(parents=True)
        rng = random.Random(f"text-{params.seed}-{i}")
        for path, page in site.items():
            file = root / ("index.html" if path == "/" else path.lstrip("/"))
            file.write_text(render(page, rng), encoding="utf-8")
        (root / "robots.txt").write_text(robots_txt(), encoding="utf-8")
    manifest = compute_manifest(params, sites)
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return manifest


def load_or_generate(params: Params, cache: Path) -> tuple[Path, dict[str, object]]:
    """The site directory for params under cache, generated once (the manifest marks it done)."""
    directory = cache / params.key()
    manifest_file = directory / MANIFEST
    if manifest_file.exists():
        manifest: dict[str, object] = json.loads(manifest_file.read_text(encoding="utf-8"))
        return directory, manifest
    return directory, generate(params, directory)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("directory", type=Path)
    ap.add_argument("--origins", type=int, default=50)
    ap.add_argument("--pages", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--base-port", type=int, default=18001)
    args = ap.parse_args()
    params = Params(args.origins, args.pages, args.seed, args.base_port)
    manifest = generate(params, args.directory)
    print(json.dumps({"required": manifest["required_by_kind"],
                      "must_not_fetch": {k: len(v) for k, v in
                                         manifest["must_not_fetch"].items()}}))  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
