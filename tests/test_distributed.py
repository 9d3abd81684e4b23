"""Many workers on one PostgreSQL crawl database: coverage, politeness across workers, failover.

Real `courtly worker` processes, a real multi-origin LocalSite, a fresh schema per test. Leases are
short (`[fleet] lease_seconds` in the workers' configuration) so that failover is quick.
"""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from courtly.site import LocalSite, Page, html
from courtly.store.postgres import conninfo_and_schema
from tests.conftest import courtly, courtly_process, fetched_paths, rows
from tests.pgserver import PgUrl

pytestmark = pytest.mark.postgres

NAMES = [f"o{i}" for i in range(6)]
PAGES = 16
DELAY = 0.08


def fleet_site(serve: Any, page_delay: float = 0.01) -> LocalSite:
    """Six origins of PAGES pages; every page links into the next origin (cross-partition)."""
    sites: dict[str, dict[str, Page]] = {name: {} for name in NAMES}
    site = serve(sites)
    for i, name in enumerate(NAMES):
        other = site.origins[NAMES[(i + 1) % len(NAMES)]]
        pages = sites[name]
        pages["/"] = Page(html(f"{name} home", [f"/p{k}" for k in range(PAGES // 2)]))
        for k in range(PAGES):
            links = [f"/p{(k + 1) % PAGES}", f"{other}/p{(k * 7) % PAGES}"]
            pages[f"/p{k}"] = Page(html(f"{name} page {k} " + "word " * k * 5, links,
                                        body=f"text {name} {k} " * (k + 3)), delay=page_delay)
    return site


def all_urls(site: LocalSite) -> set[str]:
    return {site.url(n, p) for n in NAMES for p in ["/", *(f"/p{k}" for k in range(PAGES))]}


def fleet_config(directory: Path, more: str = "") -> Path:
    """The workers' configuration: short leases, 16 partitions (and `more` [fleet] lines)."""
    path = directory / "fleet.toml"
    path.write_text("[fleet]\nlease_seconds = 2\npartitions = 16\n" + more)
    return path


def start_workers(db: PgUrl, n: int, config: Path,
                  delay: float = DELAY) -> list[subprocess.Popen[str]]:
    return [
        courtly_process("worker", "--db", db, "--min-delay", str(delay), "--progress", "off",
                        "--concurrency", "8", "--config", config)
        for _ in range(n)
    ]


def wait_all(procs: list[subprocess.Popen[str]], timeout: float = 90) -> list[str]:
    errs = []
    for proc in procs:
        _, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err
        assert "Traceback" not in err, err
        errs.append(err)
    return errs


def assert_polite(site: LocalSite, delay: float) -> None:
    """On the wire: one request at a time per origin, and the delay between any two."""
    for name in NAMES:
        for before, after in itertools.pairwise(site.hits_for(name)):
            assert after.arrived >= before.done, f"{name}: two requests in flight at once"
            assert after.arrived - before.done >= delay - 0.01, f"{name}: delay not held"


def test_three_workers_crawl_to_exact_coverage_holding_delays(serve, pg_url: PgUrl,
                                                              tmp_path: Path) -> None:
    site = fleet_site(serve)
    seeds = [site.url(n) for n in NAMES]
    added = courtly("add-seeds", *seeds, "--db", pg_url)
    assert added.status == 0, added.err
    procs = start_workers(pg_url, 3, fleet_config(tmp_path))
    errs = wait_all(procs)

    for name in NAMES:  # exact coverage: every page once, nothing else
        paths = fetched_paths(site, name)
        assert sorted(paths) == sorted(set(paths)), f"{name}: a page was fetched twice"
        assert set(paths) == {"/", *(f"/p{k}" for k in range(PAGES))}
    log = rows(pg_url, "SELECT url, worker FROM crawl_log")
    assert {r["url"] for r in log} == all_urls(site) and len(log) == len(all_urls(site))
    states = Counter(r["state"] for r in rows(pg_url, "SELECT state FROM candidates"))
    assert states == {"CRAWLED": len(all_urls(site))}
    assert_polite(site, DELAY)
    # the work was shared, and each origin was crawled by one worker at a time
    assert len({r["worker"] for r in log}) >= 2
    # the fleet is recorded: three workers, stopped cleanly, leases given back
    stats = courtly("stats", "--db", pg_url, "--json")
    fleet = json.loads(stats.out)["fleet"]
    assert len(fleet["workers"]) == 3 and fleet["free_partitions"] == 16
    assert {w["state"] for w in fleet["workers"]} == {"stopped"}
    assert sum(w["actions"] for w in fleet["workers"]) == len(log)
    table = courtly("stats", "--db", pg_url)
    assert table.status == 0 and "workers" in table.out and "pages/s" in table.out
    run = rows(pg_url, "SELECT finished FROM runs")
    assert len(run) == 1 and run[0]["finished"] is not None
    # each worker's summary counts its own origins: all finished (before, its total was the
    # fleet's configured origins and its finished its own: `origins 3 active / 3 finished`)
    for err in errs:
        counts = re.search(r"this worker's origins (\d+) active / (\d+) finished", err)
        assert counts is not None and counts[1] == "0", err


def two_busy_workers(pg_url: PgUrl, procs: list[subprocess.Popen[str]]
                     ) -> tuple[subprocess.Popen[str], str, set[str]]:
    """Wait until two workers have crawled and one of them leases origins with work left; that
    worker (the one with more crawl actions if both do), its id and those origins. (A worker
    that has handed its partitions to the other while the shares settle is no victim.)"""
    by_pid = {p.pid: p for p in procs}
    deadline = time.monotonic() + 60  # a loaded machine: imports alone can take seconds
    while time.monotonic() < deadline:
        counts = Counter(r["worker"] for r in rows(
            pg_url, "SELECT worker FROM crawl_log WHERE worker IS NOT NULL"))
        busy = [w for w, n in counts.most_common() if n >= 5]
        for worker in busy if len(busy) >= 2 else []:
            theirs = origins_of(pg_url, worker) & origins_with_work(pg_url)
            if theirs:
                return by_pid[int(worker.split(":")[1])], worker, theirs
        time.sleep(0.05)
    raise AssertionError("the workers did not get going")


def origins_with_work(pg_url: PgUrl) -> set[str]:
    """The origins with a candidate not crawled yet."""
    return {r["origin"] for r in rows(
        pg_url, "SELECT DISTINCT origin FROM candidates WHERE state <> 'CRAWLED'")}


def origins_of(pg_url: PgUrl, worker: str) -> set[str]:
    """The origins of the partitions a worker leases now."""
    return {r["origin"] for r in rows(
        pg_url, "SELECT o.origin FROM origins o JOIN leases l ON l.part = o.part "
                "WHERE l.worker = ?", worker)}


def wait_for_takeover(pg_url: PgUrl, theirs: set[str], victim: str, lease: float) -> float:
    """Wait until another worker crawls one of the victim's origins; when (monotonic)."""
    seen = {r["id"] for r in rows(pg_url, "SELECT id FROM crawl_log")}
    deadline = time.monotonic() + 5 * lease + 10
    while time.monotonic() < deadline:
        new = rows(pg_url, "SELECT id, origin, worker FROM crawl_log")
        if any(r["id"] not in seen and r["origin"] in theirs and r["worker"] != victim
               for r in new):
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError("nobody took the victim's origins over")


def test_killed_worker_loses_its_leases_and_the_other_takes_over(serve, pg_url: PgUrl,
                                                                tmp_path: Path) -> None:
    site = fleet_site(serve, page_delay=0.03)
    assert courtly("add-seeds", *(site.url(n) for n in NAMES), "--db", pg_url).status == 0
    # no same-host shortcut: the takeover must come from lease expiry
    procs = start_workers(pg_url, 2, fleet_config(tmp_path, "same_host_pid_check = false\n"),
                          delay=0.15)
    victim, victim_id, theirs = two_busy_workers(pg_url, procs)
    victim.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    victim.wait(10)
    took_over = wait_for_takeover(pg_url, theirs, victim_id, 2)
    # after the lease (2 s) expired, within a poll interval and the origin's delay of it
    assert 1.0 < took_over - killed_at < 2 + 2.0
    survivors = [p for p in procs if p is not victim]
    wait_all(survivors)

    counts = Counter(r["url"] for r in rows(pg_url, "SELECT url FROM crawl_log"))
    assert set(counts) == all_urls(site), "a URL was lost"
    twice = [u for u, n in counts.items() if n > 1]
    # only requests in flight at the kill (at most one per origin) were completed twice
    assert len(twice) <= len(NAMES)
    assert len({u.rsplit("/", 1)[0] for u in twice}) == len(twice)
    assert {r["state"] for r in rows(pg_url, "SELECT state FROM candidates")} == {"CRAWLED"}
    assert_polite(site, 0.15)
    fleet = json.loads(courtly("stats", "--db", pg_url, "--json").out)["fleet"]
    states = Counter(w["state"] for w in fleet["workers"])
    assert states == {"stopped": 1, "lost": 1}


def test_an_origins_next_request_waits_for_its_last_page_to_be_committed(
        serve, pg_url: PgUrl, tmp_path: Path) -> None:
    """In a fleet an origin's next request leaves only once its last crawl action is committed
    (a frozen or killed worker then costs its request in flight alone): while the crawl log is
    locked, no origin sends a request after the one it had in flight is answered."""
    site = fleet_site(serve, page_delay=1.0)  # every origin has a request in flight at the lock
    assert courtly("add-seeds", *(site.url(n) for n in NAMES), "--db", pg_url).status == 0
    procs = start_workers(pg_url, 1, fleet_config(tmp_path), delay=0.05)
    deadline = time.monotonic() + 60
    while len(rows(pg_url, "SELECT id FROM crawl_log")) < 12:
        assert time.monotonic() < deadline, "the worker did not get going"
        time.sleep(0.05)
    conninfo, schema = conninfo_and_schema(pg_url)
    with psycopg.connect(conninfo) as conn:  # one transaction: the lock until its end
        conn.execute(f"SET search_path TO {schema}")
        conn.execute("LOCK TABLE crawl_log IN EXCLUSIVE MODE")  # no INSERT: no commit
        locked = time.monotonic()
        time.sleep(3.0)
    wait_all(procs)
    # answers come within 1 s of the lock; an origin that did not wait for its commit sent its
    # next request 0.05 s after its answer
    late = [f"{name}{h.path}" for name in NAMES for h in site.hits_for(name)
            if locked + 0.3 < h.arrived < locked + 2.9]
    assert late == []
    assert max(Counter(r["url"] for r in rows(pg_url, "SELECT url FROM crawl_log")).values()) == 1


def test_a_frozen_worker_is_fenced_off_and_drops_its_partitions(serve, pg_url: PgUrl,
                                                                tmp_path: Path) -> None:
    """SIGSTOP a worker past its lease while the other takes over, then SIGCONT it: its
    requests in flight at the freeze (one per origin: an origin's next request leaves once its
    last page is committed) are the only pages fetched twice, the database refuses what it then
    writes under its old leases, and it drops them."""
    site = fleet_site(serve, page_delay=0.2)  # slow pages: requests are in flight at the freeze
    assert courtly("add-seeds", *(site.url(n) for n in NAMES), "--db", pg_url).status == 0
    procs = start_workers(pg_url, 2, fleet_config(tmp_path, "same_host_pid_check = false\n"),
                          delay=0.1)
    frozen, frozen_id, theirs = two_busy_workers(pg_url, procs)
    frozen.send_signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        wait_for_takeover(pg_url, theirs, frozen_id, 2)
        time.sleep(max(0.0, frozen_at + 4 - time.monotonic()))  # twice the lease
        written = len(rows(pg_url, "SELECT id FROM crawl_log WHERE worker = ?", frozen_id))
        thawed_at = time.time()
    finally:
        frozen.send_signal(signal.SIGCONT)
    errs = wait_all(procs)

    log = rows(pg_url, "SELECT url, worker, started FROM crawl_log ORDER BY id")
    counts = Counter(r["url"] for r in log)
    assert set(counts) == all_urls(site), "a URL was lost"
    # the frozen worker's actions in flight were refused: each URL has one crawl action
    assert max(counts.values()) == 1
    later = [r for r in log if r["worker"] == frozen_id][written:]
    assert all(r["started"] >= thawed_at for r in later), "a stale write was accepted"
    # on the wire: only the requests in flight at the freeze (one per origin at most)
    hits = Counter(f"{name}{path}" for name in NAMES for path in fetched_paths(site, name))
    twice = [u for u, n in hits.items() if n > 1]
    assert max(hits.values()) <= 2
    assert max(Counter(u.split("/", 1)[0] for u in twice).values(), default=0) <= 1
    assert "lost the leases of partitions" in errs[procs.index(frozen)]
    assert_polite(site, 0.1)


def heartbeat(pg_url: PgUrl, worker: str) -> float:
    return float(rows(pg_url, "SELECT heartbeat FROM workers WHERE id = ?", worker)[0]["heartbeat"])


def test_a_worker_that_joins_is_planned_its_share_at_once(serve, pg_url: PgUrl,
                                                         tmp_path: Path) -> None:
    """A crawling worker polls every lease_seconds / 4 (3 s here); between polls it reads the
    fleet's membership every quarter second, so a worker that registers right after one of its
    polls is planned its share at once (the crawling worker polls, hands back partitions), not
    an interval later."""
    site = fleet_site(serve, page_delay=0.05)
    assert courtly("add-seeds", *(site.url(n) for n in NAMES), "--db", pg_url).status == 0
    config = tmp_path / "fleet.toml"
    config.write_text("[fleet]\nlease_seconds = 12\npartitions = 16\n")  # polls 3 s apart
    crawling = start_workers(pg_url, 1, config, delay=1.0)
    try:
        deadline = time.monotonic() + 60
        while not rows(pg_url, "SELECT id FROM crawl_log"):
            assert time.monotonic() < deadline, "the worker did not get going"
            time.sleep(0.05)
        worker = str(rows(pg_url, "SELECT id FROM workers")[0]["id"])
        time.sleep(6.5)  # past its first two intervals, when it polls fast
        last = heartbeat(pg_url, worker)
        while heartbeat(pg_url, worker) == last:  # a poll just made: the next in 3 s
            time.sleep(0.01)
        polled = time.monotonic()
        conninfo, schema = conninfo_and_schema(pg_url)
        with psycopg.connect(conninfo, autocommit=True) as conn:  # registered as a worker does
            conn.execute(f"SET search_path TO {schema}")
            conn.execute("INSERT INTO workers (id, host, pid, started, heartbeat, busy, actions) "
                         "VALUES ('joiner', 'elsewhere', 1, EXTRACT(EPOCH FROM clock_timestamp()), "
                         "EXTRACT(EPOCH FROM clock_timestamp()) + 60, 1, 0)")
        joined = time.monotonic()
        last = heartbeat(pg_url, worker)
        while heartbeat(pg_url, worker) == last:
            assert time.monotonic() < polled + 2.5, "no poll before the interval was over"
            time.sleep(0.01)
        assert time.monotonic() - joined < 1.0
        # its share planned: partitions handed back for the newcomer within two more polls
        while not rows(pg_url, "SELECT part FROM leases WHERE worker IS NULL"):
            assert time.monotonic() < joined + 2.0, "no partition handed back"
            time.sleep(0.01)
    finally:
        for proc in crawling:
            proc.terminate()
            proc.communicate(timeout=30)


def test_continuous_worker_waits_for_new_seeds(serve, pg_url: PgUrl, tmp_path: Path) -> None:
    site = serve({"a": {"/": Page(html("A", ["/x"])), "/x": Page(html("X", []))},
                  "b": {"/": Page(html("B", ["/y"])), "/y": Page(html("Y", []))}})
    assert courtly("add-seeds", site.url("a"), "--db", pg_url).status == 0
    proc = courtly_process("worker", "--db", pg_url, "--continuous", "--min-delay", "0",
                           "--progress", "off", "--config", fleet_config(tmp_path))
    try:
        deadline = time.monotonic() + 20
        while len(fetched_paths(site, "a")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(fetched_paths(site, "a")) == {"/", "/x"}
        time.sleep(1.0)
        assert proc.poll() is None, "a --continuous worker exited"
        assert courtly("add-seeds", site.url("b"), "--db", pg_url).status == 0
        while len(fetched_paths(site, "b")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(fetched_paths(site, "b")) == {"/", "/y"}
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "stopped by SIGTERM" in err


def test_a_worker_started_before_any_seed_crawls_the_seeds_added_later(
        serve, pg_url: PgUrl, tmp_path: Path) -> None:
    """The address guard lets the seeds' own hosts through: before, it knew only the seeds of
    the worker's start, and a seed on 127.0.0.1 added later was BLOCKED_ADDRESS (for a day)."""
    site = serve({"a": {"/": Page(html("A", ["/x"])), "/x": Page(html("X", []))}})
    proc = courtly_process("worker", "--db", pg_url, "--continuous", "--min-delay", "0",
                           "--progress", "off", "--config", fleet_config(tmp_path))
    try:
        time.sleep(1.5)  # the worker has joined, with nothing to crawl
        assert proc.poll() is None, "a --continuous worker exited"
        assert courtly("add-seeds", site.url("a"), "--db", pg_url).status == 0
        deadline = time.monotonic() + 20
        while len(fetched_paths(site, "a")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    codes = {r["url"]: r["exit_code"] for r in rows(pg_url, "SELECT url, exit_code FROM crawl_log")}
    assert codes == {site.url("a"): "OK", site.url("a", "/x"): "OK"}, codes


def test_an_origin_finished_again_is_counted_once(serve, pg_url: PgUrl, tmp_path: Path) -> None:
    """A --continuous worker whose one origin got new seeds twice ended with `origins 0 active
    / 3 finished` (each time an origin came back, its finish was counted again; a worker
    retaking its partitions after lost leases counted thousands)."""
    site = serve({"a": {"/": Page(html("A", [])), "/x": Page(html("X", [])),
                        "/y": Page(html("Y", []))}})
    assert courtly("add-seeds", site.url("a"), "--db", pg_url).status == 0
    proc = courtly_process("worker", "--db", pg_url, "--continuous", "--min-delay", "0",
                           "--progress", "off", "--config", fleet_config(tmp_path))
    try:
        deadline = time.monotonic() + 20
        for done, more in ((["/"], "/x"), (["/", "/x"], "/y"), (["/", "/x", "/y"], None)):
            while fetched_paths(site, "a") != done and time.monotonic() < deadline:
                time.sleep(0.05)
            assert fetched_paths(site, "a") == done
            time.sleep(1.5)  # the worker polls, finds the origin finished and forgets it
            if more is not None:
                assert courtly("add-seeds", site.url("a", more), "--db", pg_url).status == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "stopped by SIGTERM" in err
    assert "origins 0 active / 1 finished" in err, err


def test_worker_needs_a_postgres_database(tmp_path) -> None:
    run = courtly("worker", "--db", tmp_path / "x.db")
    assert run.status == 2 and "postgresql://" in run.err


def test_a_forced_recrawl_is_one_per_run_however_many_workers_join(
    serve, pg_url: PgUrl, tmp_path: Path
) -> None:
    """Each worker started with --force-recrawl made every known URL due again, those the
    fleet had already recrawled in this run too: after the run they were left due, and the
    next run fetched them once more. Now a joiner of the run marks only what this run has not
    crawled yet: one forced recrawl per run, then nothing is due."""
    site = fleet_site(serve)
    assert courtly("add-seeds", *(site.url(n) for n in NAMES), "--db", pg_url).status == 0
    config = fleet_config(tmp_path)
    wait_all(start_workers(pg_url, 1, config, delay=0))
    first = {name: len(fetched_paths(site, name)) for name in NAMES}

    def forced() -> subprocess.Popen[str]:
        return courtly_process("worker", "--db", pg_url, "--force-recrawl", "--min-delay",
                               "0.3", "--progress", "off", "--config", config)

    procs = [forced()]
    deadline = time.monotonic() + 60
    while len(rows(pg_url, "SELECT id FROM crawl_log")) < len(all_urls(site)) + 30:
        assert time.monotonic() < deadline and procs[0].poll() is None, "no recrawl under way"
        time.sleep(0.05)
    procs.append(forced())  # joins the run a third of the way in
    wait_all(procs)
    assert len(rows(pg_url, "SELECT id FROM runs")) == 2
    for name in NAMES:  # the forced run: every page once
        paths = fetched_paths(site, name)[first[name]:]
        assert sorted(paths) == sorted({"/", *(f"/p{k}" for k in range(PAGES))}), name
    second = {name: len(fetched_paths(site, name)) for name in NAMES}

    wait_all(start_workers(pg_url, 1, config, delay=0))  # a plain run: nothing is due
    assert {name: fetched_paths(site, name)[second[name]:] for name in NAMES} == {
        name: [] for name in NAMES}
