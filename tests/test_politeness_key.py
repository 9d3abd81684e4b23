"""politeness_key: origins that share a host, a registered domain or an IP address share one
request at a time and one delay, measured on the wire (one server behind 50 host names)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from courtly.scheduler import politeness_key
from courtly.site import Hit, Page, html
from tests.conftest import courtly, robots

SLACK = 0.005
DELAY = 0.03
NAMES = 50


def in_flight_at_once(hits: list[Hit]) -> int:
    """The most requests the server had in flight at one moment."""
    events = sorted([(h.arrived, 1) for h in hits] + [(h.done, -1) for h in hits])
    return max(itertools.accumulate(step for _, step in events))


def crawl_by_names(serve, db: Path, tmp_path: Path, names: list[str], key: str) -> list[Hit]:
    """Crawl http://NAME:PORT/ for each name, every name resolving to the one test server
    (limits.dns_hosts)."""
    site = serve({"server": {"/robots.txt": robots("User-agent: *\nDisallow: /private\n"),
                             "/": Page(html("home", ["/a", "/private"]), delay=0.01),
                             "/a": Page(html("a", ["/"]), delay=0.01)}})
    port = site.origins["server"].rsplit(":", 1)[1]
    hosts = ", ".join(f'"{n}" = "127.0.0.1"' for n in names)
    cfg = tmp_path / "crawl.toml"
    cfg.write_text(f'[politeness]\npoliteness_key = "{key}"\n[limits]\ndns_hosts = {{ {hosts} }}\n'
                   "[dedup]\nexact = false\nnear = false\n")  # one page behind every name
    run = courtly("crawl", *(f"http://{n}:{port}/" for n in names), "--db", db,
                  "--min-delay", str(DELAY), "--concurrency", "16", "--config", cfg)
    assert run.status == 0, run.err
    hits = sorted(site.hits, key=lambda h: h.arrived)
    seen = {(h.headers["Host"].partition(":")[0], h.path) for h in hits}
    assert seen == {(n, p) for n in names for p in ("/robots.txt", "/", "/a")}
    return hits


@pytest.mark.parametrize(("key", "names"), [
    ("ip", [f"site{i}.test" for i in range(NAMES)]),  # one address
    ("domain", [f"s{i}.example.com" for i in range(NAMES)]),  # one registered domain
])
def test_origins_of_one_key_see_one_request_at_a_time(serve, db: Path, tmp_path: Path,
                                                      key: str, names: list[str]) -> None:
    hits = crawl_by_names(serve, db, tmp_path, names, key)
    assert in_flight_at_once(hits) == 1
    gaps = [after.arrived - before.done for before, after in itertools.pairwise(hits)]
    assert min(gaps) >= DELAY - SLACK  # one delay for all of them


def test_each_origin_is_its_own_key_by_default(serve, db: Path, tmp_path: Path) -> None:
    """The same web with the default key: the 50 origins are crawled side by side."""
    hits = crawl_by_names(serve, db, tmp_path, [f"site{i}.test" for i in range(NAMES)], "origin")
    assert in_flight_at_once(hits) > 1


def test_keys_of_host_and_domain() -> None:
    assert politeness_key("https://a.example.co.uk:443", "domain") == "example.co.uk"
    assert politeness_key("http://a.example.co.uk:80", "host") == "a.example.co.uk"
    assert politeness_key("http://a.example.co.uk:80", "origin") == "http://a.example.co.uk:80"
    assert politeness_key("http://127.1.2.3:80", "domain") == "127.1.2.3"
