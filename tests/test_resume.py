"""Stop anywhere: kill -9, SIGTERM and SIGINT, then resume with a real `courtly` subprocess."""

from __future__ import annotations

import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest

from courtly.model import Link
from courtly.site import Page, html
from courtly.store.sqlite import SqliteStore
from courtly.strategy import BreadthFirst, Response
from tests.conftest import courtly, courtly_process, fetched_paths, rows

PAGES = 60
BACKENDS = ("sqlite", "postgres")  # the `db` tests run on both (tests/conftest.py)


def chain_site(name: str) -> dict[str, Page]:
    pages = {"/": Page(html(f"{name} home", [f"/p{i}" for i in range(PAGES)]))}
    pages |= {f"/p{i}": Page(html(f"{name} {i}", ["/", f"/p{(i + 1) % PAGES}"]), delay=0.005)
              for i in range(PAGES)}
    return pages


def wait_for_actions(db: Path, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.exists():
            try:
                if len(rows(db, "SELECT id FROM crawl_log")) >= n:
                    return
            except Exception:  # the database may be mid-creation
                pass
        time.sleep(0.02)
    raise AssertionError(f"fewer than {n} crawl actions after {timeout}s")


def completed_once(db: Path) -> Counter[str]:
    log = rows(db, "SELECT url FROM crawl_log WHERE exit_code IN ('OK', 'DUPLICATE_CONTENT')")
    return Counter(r["url"] for r in log)


@pytest.mark.parametrize("commit_interval", [0.0, 0.1])
def test_kill_9_then_resume_completes_every_page_once(
    serve, db: Path, tmp_path: Path, commit_interval: float
) -> None:
    """Each completed crawl action is in the database exactly once. With group commit (SQLite,
    commit_interval > 0) the results of the last window before the kill are lost and those pages
    are fetched again on resume: the server sees at most that window's requests twice."""
    site = serve({"a": chain_site("a"), "b": chain_site("b")})
    config = tmp_path / "crawl.toml"
    config.write_text(f"commit_interval = {commit_interval}\n")
    proc = courtly_process("crawl", site.url("a"), site.url("b"), "--db", db, "--config", config,
                           "--min-delay", "0.01", "--progress", "off")
    wait_for_actions(db, 30)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    killed_at = len(rows(db, "SELECT id FROM crawl_log"))
    assert 0 < killed_at < 2 * (PAGES + 1)

    resumed = courtly("crawl", "--db", db, "--min-delay", "0.01")
    assert resumed.status == 0, resumed.err
    counts = completed_once(db)
    assert len(counts) == 2 * (PAGES + 1)
    # at most the requests in flight at the kill (one per origin) were crawled twice
    assert sum(n - 1 for n in counts.values()) <= 2
    states = {r["state"] for r in rows(db, "SELECT state FROM candidates")}
    assert states == {"CRAWLED"}
    # each request takes ≥ 15 ms (5 ms answer + 10 ms delay): a window holds ≤ 7 per origin
    window = int(commit_interval / 0.015) if isinstance(db, Path) else 0
    for name in ("a", "b"):
        paths = Counter(fetched_paths(site, name))
        assert len(paths) == PAGES + 1
        assert sum(n - 1 for n in paths.values()) <= 1 + window
    if isinstance(db, Path):  # SQLite
        assert rows(db, "PRAGMA integrity_check")[0]["integrity_check"] == "ok"


@pytest.mark.parametrize("again", [[], ["--force-recrawl"]])
def test_a_forced_recrawl_killed_and_resumed_recrawls_what_it_left(
    serve, db: Path, tmp_path: Path, again: list[str]
) -> None:
    """--force-recrawl makes every URL due in the database: the resume, a plain `crawl`,
    recrawls the pages the killed run had not reached (they were waiting for their own due
    time, 7 days away), and none it had. Resumed with the flag again, it made due what the
    killed run had recrawled too: the next crawl fetched them once more; now nothing is due."""
    site = serve({"a": chain_site("a"), "b": chain_site("b")})
    first_run = courtly("crawl", site.url("a"), site.url("b"), "--db", db, "--min-delay", "0")
    assert first_run.status == 0, first_run.err
    first = {name: len(fetched_paths(site, name)) for name in ("a", "b")}
    total = 2 * (PAGES + 1)
    config = tmp_path / "crawl.toml"
    config.write_text("commit_interval = 0\n")  # each action seen as it is recorded
    proc = courtly_process("crawl", "--db", db, "--force-recrawl", "--min-delay", "0.05",
                           "--config", config, "--progress", "off")
    wait_for_actions(db, total + 30)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert len(rows(db, "SELECT id FROM crawl_log")) < 2 * total  # killed mid-way

    resumed = courtly("crawl", "--db", db, "--min-delay", "0.01", *again)
    assert resumed.status == 0, resumed.err
    for name in ("a", "b"):
        paths = Counter(fetched_paths(site, name)[first[name]:])
        assert len(paths) == PAGES + 1, name  # every page recrawled
        assert sum(n - 1 for n in paths.values()) <= 1  # but the one in flight, once
    second = {name: len(fetched_paths(site, name)) for name in ("a", "b")}
    assert courtly("crawl", "--db", db, "--min-delay", "0").status == 0
    assert [fetched_paths(site, name)[second[name]:] for name in ("a", "b")] == [[], []]


def test_a_group_of_writes_is_committed_once_it_is_commit_interval_old(tmp_path: Path) -> None:
    """The crawler's housekeeping calls flush(commit_interval) twice a second: a younger group
    stays open (other connections do not see it yet), an old enough one is committed."""
    path = tmp_path / "group.db"
    store = SqliteStore(str(path))
    store.commit_interval = 0.4
    store.add_links([Link(f"http://a.test/{i}", "http://a.test", 1, 0.5) for i in range(5)])
    reader = sqlite3.connect(path)
    count = "SELECT count(*) FROM candidates"
    store.flush(store.commit_interval)
    assert reader.execute(count).fetchone()[0] == 0
    time.sleep(0.45)
    store.flush(store.commit_interval)
    assert reader.execute(count).fetchone()[0] == 5
    store.add_links([Link("http://a.test/x", "http://a.test", 1, 0.5)])
    store.flush()  # at once: the end of a crawl
    assert reader.execute(count).fetchone()[0] == 6
    store.close()


def test_sigterm_and_sigint_stop_cleanly_and_resume(serve, db: Path, tmp_path: Path) -> None:
    site = serve({"a": chain_site("a")})
    config = tmp_path / "crawl.toml"  # commits often enough for the test to see progress
    config.write_text("commit_interval = 0.1\n")
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc = courtly_process("crawl", site.url("a"), "--db", db, "--min-delay", "0.05",
                               "--progress", "off", "--config", config)
        wait_for_actions(db, len(rows(db, "SELECT id FROM crawl_log")) + 3 if db.exists() else 3)
        sent = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=10)
        assert time.monotonic() - sent < 5, "did not stop within a few seconds"
        assert proc.returncode == 0, err
        assert "Traceback" not in err and "stopped by" in err
    assert courtly("crawl", "--db", db, "--min-delay", "0").status == 0
    counts = completed_once(db)
    assert len(counts) == PAGES + 1 and set(counts.values()) == {1}
    assert len(fetched_paths(site, "a")) == PAGES + 1


class SlowClose(BreadthFirst):
    """Breadth-first, with a close() at the end of a crawl that takes a while (module:Class)."""

    crawled = 0

    def page_crawled(self, response: Response) -> None:
        """Count the pages (the add-seeds step closes its own instance before any)."""
        self.crawled += 1

    def close(self) -> None:
        """After a crawl: say so in a file, then take a second and a half."""
        super().close()
        if self.crawled:
            Path(self.args["marker"]).write_text("closing")
            time.sleep(1.5)


def test_a_signal_during_the_shut_down_still_exits_cleanly(serve, db: Path,
                                                           tmp_path: Path) -> None:
    site = serve({"a": {"/": Page(html("home", ["/b"])), "/b": Page(html("b", []))}})
    marker = tmp_path / "closing"
    config = tmp_path / "crawl.toml"
    config.write_text(f'strategy = "tests.test_resume:SlowClose"\n'
                      f'[strategy_args]\nmarker = "{marker}"\n')
    proc = courtly_process("crawl", site.url("a"), "--db", db, "--min-delay", "0",
                           "--progress", "off", "--config", config)
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert marker.exists(), "the crawl never reached its shut-down"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "finished" in err
    assert len(completed_once(db)) == 2
