"""Stopped at the worst moments, resumed where it was: politeness across the restart.

A real `courtly` subprocess is stopped (kill -9, SIGINT, SIGTERM) and resumed; the local
server's log says when each request arrived and ended.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from courtly.site import Hit, LocalSite, Page, html
from tests.conftest import ROBOTS_TEXT, courtly_process, fetched_paths, rows

PAGES = 8


def small_site(name: str) -> dict[str, Page]:
    """A home page linking PAGES pages, and a robots.txt that allows them."""
    pages = {"/robots.txt": Page("User-agent: *\nAllow: /\n", headers=ROBOTS_TEXT),
             "/": Page(html(f"{name} home", [f"/p{i}" for i in range(PAGES)]))}
    return pages | {f"/p{i}": Page(html(f"{name} {i}", ["/"])) for i in range(PAGES)}


def stop(proc: subprocess.Popen[str], sig: signal.Signals) -> str:
    """Send `sig`; the process's standard error once it ended (no traceback)."""
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=20)
    assert "Traceback" not in err, err
    return err


def wait_for_hits(site: LocalSite, n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while len(site.hits) < n and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(site.hits) >= n, f"fewer than {n} requests after {timeout}s"


def gaps(hits: list[Hit]) -> list[float]:
    """Seconds from the end of each request to the arrival of the next one."""
    return [b.arrived - a.done for a, b in itertools.pairwise(hits)]


def test_killed_right_after_robots_txt_the_resume_waits_its_delay(serve, tmp_path: Path
                                                                   ) -> None:
    """kill -9 once robots.txt was answered, before it was committed: the resumed crawl asks
    for it again, a full delay after the kill (before, at once: the origin looked new)."""
    site = serve({"a": small_site("a")})
    db = tmp_path / "crawl.db"
    args = ["crawl", site.url("a"), "--db", db, "--min-delay", "3", "--progress", "off"]
    proc = courtly_process(*args)
    wait_for_hits(site, 1)
    stop(proc, signal.SIGKILL)
    resumed = courtly_process(*args, "--max-actions", "1")
    _, err = resumed.communicate(timeout=30)
    assert resumed.returncode == 0, err
    hits = site.hits_for("a")
    assert [h.path for h in hits][:2] == ["/robots.txt", "/robots.txt"]
    assert min(gaps(hits)) >= 3


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_after_a_clean_stop_the_resume_waits_only_what_is_left_of_the_delay(
    serve, tmp_path: Path, sig: signal.Signals
) -> None:
    """A crawl stopped by a signal records when it last asked each origin: resumed once the
    delay has passed, it asks at once (before, it waited the whole delay again); resumed
    sooner, it waits the rest."""
    site = serve({"a": small_site("a")})
    db = tmp_path / "crawl.db"
    args = ["crawl", site.url("a"), "--db", db, "--min-delay", "3", "--progress", "off"]
    proc = courtly_process(*args)
    wait_for_hits(site, 2)  # robots.txt and the home page
    err = stop(proc, sig)
    assert proc.returncode == 0 and f"stopped by {sig.name}" in err, err
    stopped = time.monotonic()
    time.sleep(max(0.0, site.hits_for("a")[-1].done + 3 - time.monotonic()))
    started = time.monotonic()
    resumed = courtly_process(*args, "--max-actions", "2")
    _, err = resumed.communicate(timeout=30)
    assert resumed.returncode == 0, err
    hits = site.hits_for("a")
    assert [h.path for h in hits][:3] == ["/robots.txt", "/", "/p0"]
    assert hits[2].arrived - started < 2.5, "the resume waited a delay that had passed"
    assert min(gaps(hits)) >= 3
    assert stopped < started


def test_stopped_at_random_moments_every_page_once_and_no_request_too_soon(
    serve, tmp_path: Path
) -> None:
    """kill -9 during the first robots.txt fetches, then SIGINT, SIGTERM and kill -9 in turn at
    random moments, each run resumed: the server
    never saw two requests closer than the delay, every page has one completed crawl action
    (the log has every page), and the database is intact."""
    delay = 1.2  # longer than a resume takes to start: its first request could come too soon
    site = serve({"a": small_site("a"), "b": small_site("b")})
    db = tmp_path / "crawl.db"
    config = tmp_path / "crawl.toml"
    config.write_text("commit_interval = 0.2\nprogress = \"off\"\n")
    args = ["crawl", site.url("a"), site.url("b"), "--db", db, "--min-delay", str(delay),
            "--config", config]
    rng = random.Random(5)
    proc = courtly_process(*args)
    wait_for_hits(site, 2)  # the first robots.txt fetches
    stop(proc, signal.SIGKILL)
    for sig in [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]:
        proc = courtly_process(*args)
        wait_for_hits(site, len(site.hits) + rng.randint(1, 3))
        time.sleep(rng.uniform(0, delay))
        stop(proc, sig)
    final = courtly_process(*args)
    _, err = final.communicate(timeout=60)
    assert final.returncode == 0 and "finished" in err, err
    for name in ("a", "b"):
        assert min(gaps(site.hits_for(name))) >= delay, name
        assert set(fetched_paths(site, name)) == {"/", *(f"/p{i}" for i in range(PAGES))}
    log = rows(db, "SELECT id, url FROM crawl_log WHERE exit_code = 'OK' ORDER BY id")
    done = Counter(r["url"] for r in log)
    assert len(done) == 2 * (PAGES + 1) and set(done.values()) == {1}
    assert [r["id"] for r in log] == list(range(1, len(log) + 1))  # no gap in the log
    assert rows(db, "PRAGMA integrity_check")[0]["integrity_check"] == "ok"


def running(pid: int) -> bool:
    """Whether a process is alive (a zombie waiting to be reaped is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_kill_9_while_a_page_is_parsed_leaves_no_page_worker_behind(serve, tmp_path: Path
                                                                    ) -> None:
    """kill -9 while the page worker parses a page slow to parse: the worker dies with the
    crawl (before, the orphan parsed on for minutes, the watchdog being the crawl's, and held
    the crawl's standard output and error open: a pipe from `courtly crawl` did not end)."""
    slow = "<html><body>" + "<div></span>" * 400_000 + "</body></html>"  # quadratic in lexbor
    site = serve({"a": {"/": Page(html("home", ["/slow"])), "/slow": Page(slow)}})
    proc = courtly_process("crawl", site.url("a"), "--db", tmp_path / "crawl.db",
                           "--min-delay", "0", "--progress", "off")
    deadline = time.monotonic() + 20
    while "/slow" not in fetched_paths(site, "a") and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # its body read and sent to the worker
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert children, "no page worker"
    proc.kill()
    proc.wait(10)
    deadline = time.monotonic() + 3
    try:
        while any(running(int(pid)) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(running(int(pid)) for pid in children), "the page worker outlived the crawl"
    finally:
        for pid in children:  # the orphan of a failed run, ours
            if running(int(pid)):
                os.kill(int(pid), signal.SIGKILL)
        proc.communicate(timeout=10)  # the crawl's output pipes, which the orphan held open
