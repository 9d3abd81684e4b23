"""courtly's own machine: a crawl never runs out of file descriptors on its own account, and a
crawl that does run out waits, then carries on or stops with one line; a site never pays."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from courtly.site import LocalSite, Page, html
from tests.conftest import rows

ROOT = Path(__file__).resolve().parent.parent


def limit_descriptors(count: int) -> Callable[[], None]:
    """A preexec_fn giving the child process at most `count` open files."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))
    return apply


def crawl_process(args: list[str], descriptors: int) -> subprocess.CompletedProcess[str]:
    """`courtly crawl ARGS` in a process of its own with a descriptor limit."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}  # for tests.hoarder
    return subprocess.run(
        [sys.executable, "-m", "courtly", "crawl", *args], capture_output=True, text=True,
        env=env, preexec_fn=limit_descriptors(descriptors), timeout=240, check=False)


def small_site(count: int) -> dict[str, dict[str, Page]]:
    """`count` origins of three pages each."""
    return {f"o{i}": {"/": Page(html(f"home {i}", ["/a", "/b"])),
                      "/a": Page(html(f"a {i}", [])), "/b": Page(html(f"b {i}", []))}
            for i in range(count)}


def test_300_origins_under_a_limit_of_64_descriptors_are_crawled_completely(
        tmp_path: Path) -> None:
    """The connection pool's bound comes from RLIMIT_NOFILE: idle connections are closed least
    recently used first, so 300 origins crawled 64 at a time never exhaust 64 descriptors."""
    with LocalSite(small_site(300)) as site:
        seeds = tmp_path / "seeds.txt"
        seeds.write_text("".join(url + "/\n" for url in site.origins.values()))
        db = tmp_path / "crawl.db"
        done = crawl_process(["--seeds-file", str(seeds), "--db", str(db), "--min-delay", "0",
                              "--concurrency", "64"], descriptors=64)
        hits = Counter((h.origin, h.path) for h in site.hits)
    assert done.returncode == 0, done.stderr
    assert "Too many open files" not in done.stderr + done.stdout
    codes = Counter(r["exit_code"] for r in rows(db, "SELECT exit_code FROM crawl_log"))
    assert codes == {"OK": 900}, codes
    assert len(rows(db, "SELECT url FROM candidates WHERE state = 'CRAWLED'")) == 900
    assert all(hits[(origin, "/robots.txt")] == 1 for origin in site.origins.values())


def one_origin() -> dict[str, dict[str, Page]]:
    """robots.txt answered on a connection that is then closed: nothing stays open."""
    site = small_site(1)
    site["o0"]["/robots.txt"] = Page("User-agent: *\nAllow: /\n", headers={
        "Content-Type": "text/plain", "Connection": "close"})
    return site


def test_a_crawl_out_of_descriptors_stops_with_one_line_and_costs_no_patience(
        tmp_path: Path) -> None:
    """The strategy takes every free descriptor once robots.txt is read: no page can be
    fetched. The crawl waits `local_error_wait`, then exits 1 with one line; nothing is
    blamed on the site, and the next run crawls every page."""
    config = tmp_path / "courtly.toml"
    config.write_text("[limits]\nlocal_error_wait = 1.0\n")
    with LocalSite(one_origin()) as site:
        url = site.url("o0")
        db = tmp_path / "crawl.db"
        done = crawl_process([url, "--db", str(db), "--min-delay", "0", "--config", str(config),
                              "--strategy", "tests.hoarder:Hoarder"], descriptors=256)
        assert done.returncode == 1, done.stderr
        reason = [line for line in done.stderr.splitlines() if line.startswith("courtly:")]
        assert len(reason) == 1, done.stderr
        assert reason[0].startswith("courtly: local error: connect: ")
        assert "Too many open files for 1s" in reason[0]
        assert "Traceback" not in done.stderr
        assert rows(db, "SELECT url FROM crawl_log") == []  # no crawl action blamed the site
        assert [h.path for h in site.hits] == ["/robots.txt"]
        again = crawl_process(["--db", str(db), "--min-delay", "0"], descriptors=256)
    assert again.returncode == 0, again.stderr
    codes = [r["exit_code"] for r in rows(db, "SELECT exit_code FROM crawl_log")]
    assert codes == ["OK"] * 3


def test_a_crawl_short_of_descriptors_for_a_moment_waits_and_carries_on(tmp_path: Path) -> None:
    """The descriptors come back as soon as the client says it is short of them: the crawl
    pauses, then fetches every page, with no error and no patience lost."""
    config = tmp_path / "courtly.toml"
    config.write_text("strategy_args = {release = true}\n[limits]\nlocal_error_wait = 30.0\n")
    with LocalSite(one_origin()) as site:
        db = tmp_path / "crawl.db"
        done = crawl_process([site.url("o0"), "--db", str(db), "--min-delay", "0",
                              "--config", str(config), "--strategy", "tests.hoarder:Hoarder"],
                             descriptors=256)
    assert done.returncode == 0, done.stderr
    assert "short of resources (connect: [Errno 24] Too many open files)" in done.stderr
    codes = [r["exit_code"] for r in rows(db, "SELECT exit_code FROM crawl_log")]
    assert codes == ["OK"] * 3
