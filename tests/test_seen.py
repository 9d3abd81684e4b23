"""The seen cache in front of the crawl database: same answers as the database, bounded memory."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from courtly.model import Candidate, CrawlAction, ExitCode, Link, LinkState
from courtly.store.seen import SeenCache
from courtly.store.sqlite import SqliteStore

ORG = "http://a.example:80"


def test_new_links_are_the_upserts_that_could_change_something() -> None:
    seen = SeenCache()
    seen.put(f"{ORG}/crawled", LinkState.CRAWLED)
    seen.put(f"{ORG}/fresh", LinkState.NOT_CRAWLED, 0.5)
    seen.absent(f"{ORG}/absent")
    links = [Link(f"{ORG}/{name}", ORG, 1, score) for name, score in
             [("crawled", 1.0), ("fresh", 0.4), ("fresh", 0.6), ("absent", 0.2), ("unknown", 0.1)]]
    # CRAWLED: never changed by an upsert; a NOT_CRAWLED score only rises; absent is inserted
    assert [(lk.url.rsplit("/", 1)[1], lk.score) for lk in seen.new_links(links)] == [
        ("fresh", 0.6), ("absent", 0.2), ("unknown", 0.1)]
    # inserted by that upsert
    assert seen.known([f"{ORG}/absent"]) == ({f"{ORG}/absent": LinkState.NOT_CRAWLED}, [])
    assert seen.new_links([Link(f"{ORG}/fresh", ORG, 1, 0.6)]) == []  # the raised score is known
    # its state after the upsert is unknown
    assert seen.known([f"{ORG}/unknown"]) == ({}, [f"{ORG}/unknown"])


def test_changing_is_new_links_test_without_recording() -> None:
    seen = SeenCache()
    seen.put(f"{ORG}/crawled", LinkState.CRAWLED)
    seen.put(f"{ORG}/fresh", LinkState.NOT_CRAWLED, 0.5)
    seen.absent(f"{ORG}/absent")
    urls = [f"{ORG}/{name}" for name in ("crawled", "fresh", "absent", "unknown")]
    for score in (0.4, 0.5, 0.6):
        links = [Link(u, ORG, 1, score) for u in urls]
        expected = [lk.url for lk in _copy(seen).new_links(links)]
        assert seen.changing(urls, score)[0] == expected
        assert seen.changing(urls, score)[0] == expected  # nothing was recorded
    assert seen.changing(urls, 0.4) == ([f"{ORG}/absent", f"{ORG}/unknown"], [f"{ORG}/unknown"])


def _copy(seen: SeenCache) -> SeenCache:
    twin = SeenCache(seen.size)
    twin._entries = dict(seen._entries)
    return twin


def test_store_unsettled_links_are_those_an_upsert_would_change(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "c.db"))
    try:
        store.add_origins([ORG])
        urls = [f"{ORG}/{i}" for i in range(4)]
        store.add_links([Link(u, ORG, 1, 0.5) for u in urls[:3]])
        run = store.begin_run()
        done = store.take_todo(ORG, run, 1, time.time())[0]
        store.record(CrawlAction(done, ORG, ExitCode.OK, time.time(), http_status=200), run)
        fresh = [u for u in urls[:3] if u != done.url]
        reopened = SqliteStore(str(tmp_path / "c.db"))  # an empty cache: read from the database
        try:
            for store_ in (store, reopened):
                assert store_.unsettled(urls, 0.5) == [urls[3]]  # the same score: no change
                assert store_.unsettled(urls, 0.9) == [*fresh, urls[3]]  # raised, and new
        finally:
            reopened.close()
    finally:
        store.close()


def test_the_cache_is_bounded_oldest_out() -> None:
    seen = SeenCache(size=3)
    for i in range(5):
        seen.put(f"{ORG}/{i}", LinkState.CRAWLED)
    seen.put(f"{ORG}/2", LinkState.ERROR)  # re-put: the newest again
    seen.put(f"{ORG}/5", LinkState.CRAWLED)
    states, unknown = seen.known(f"{ORG}/{i}" for i in range(6))
    assert unknown == [f"{ORG}/{i}" for i in (0, 1, 3)]
    assert states == {f"{ORG}/2": LinkState.ERROR, f"{ORG}/4": LinkState.CRAWLED,
                      f"{ORG}/5": LinkState.CRAWLED}


def test_store_states_agree_with_the_database_through_the_cache(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "c.db"))
    try:
        store.add_origins([ORG])
        urls = [f"{ORG}/{i}" for i in range(4)]
        assert store.add_links([Link(u, ORG, 1, 0.5) for u in urls[:3]]) == 3
        run = store.begin_run()
        todo = store.take_todo(ORG, run, 2, time.time())
        store.record(CrawlAction(todo[0], ORG, ExitCode.OK, time.time(), http_status=200), run)
        store.record(CrawlAction(todo[1], ORG, ExitCode.HTTP_CLIENT_ERROR, time.time(),
                                 http_status=404), run)
        expected = {todo[0].url: LinkState.CRAWLED, todo[1].url: LinkState.ERROR,
                    urls[2]: LinkState.NOT_CRAWLED}
        assert store.states(urls) == expected  # urls[3]: unknown
        assert store.states(urls) == expected  # the same from the cache
        assert store.add_links([Link(urls[3], ORG, 1, 0.5)]) == 1  # known absent: inserted
        assert store.add_links([Link(urls[2], ORG, 1, 0.9)]) == 1  # a higher score: raised
        assert store.add_links([Link(urls[2], ORG, 1, 0.9), Link(todo[0].url, ORG, 1, 1.0)]) == 0
        fresh = SqliteStore(str(tmp_path / "c.db"))  # no cache: what the database says
        try:
            assert fresh.states(urls) == store.states(urls)
            left = fresh.take_todo(ORG, run, 10, time.time())
            assert [(c.url, c.score) for c in left] == [(urls[2], 0.9), (urls[3], 0.5)]
        finally:
            fresh.close()
    finally:
        store.close()


def test_a_failed_write_empties_the_cache(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "c.db"))
    try:
        store.add_origins([ORG])
        store.add_links([Link(f"{ORG}/a", ORG, 0, 1.0)])
        store.states([f"{ORG}/a"])
        assert store.seen.known([f"{ORG}/a"])[1] == []
        ghost = Candidate(10**9, f"{ORG}/ghost", 0, 1.0)
        bad = CrawlAction(ghost, ORG, ExitCode.OK, time.time(), http_status=200)
        bad.near_signature = "not bytes"  # type: ignore[assignment]  # fails half-way
        with pytest.raises(TypeError):
            store.record(bad, store.begin_run())
        assert store.seen.known([f"{ORG}/a"])[1] == [f"{ORG}/a"]
    finally:
        store.close()


def test_an_integer_score_is_still_a_score() -> None:
    seen = SeenCache()
    seen.absent(f"{ORG}/x")
    assert seen.new_links([Link(f"{ORG}/x", ORG, 0, 1)])  # type checkers aside, 1 is a score
    assert seen.known([f"{ORG}/x"]) == ({f"{ORG}/x": LinkState.NOT_CRAWLED}, [])
    seen.put(f"{ORG}/y", LinkState.NOT_CRAWLED, 0)
    assert seen.known([f"{ORG}/y"]) == ({f"{ORG}/y": LinkState.NOT_CRAWLED}, [])


def test_a_failed_write_in_a_group_rolls_the_group_back(tmp_path: Path) -> None:
    """Group commit: a write failing half-way undoes the whole open group, never half an action;
    the store goes on with a new transaction (the crawl stops, and resumes from the last commit)."""
    store = SqliteStore(str(tmp_path / "c.db"))
    try:
        store.add_origins([ORG])
        store.commit_interval = 60.0
        store.add_links([Link(f"{ORG}/a", ORG, 0, 1.0)])  # opens the group
        ghost = Candidate(10**9, f"{ORG}/ghost", 0, 1.0)
        bad = CrawlAction(ghost, ORG, ExitCode.OK, time.time(), http_status=200)
        bad.near_signature = "not bytes"  # type: ignore[assignment]  # fails half-way
        with pytest.raises(TypeError):
            store.record(bad, store.begin_run())
        assert store.states([f"{ORG}/a"]) == {}  # the group's link is gone too
        assert store._db.execute("SELECT COUNT(*) FROM crawl_log").fetchone()[0] == 0
        store.add_links([Link(f"{ORG}/b", ORG, 0, 1.0)])
        store.flush()
        assert store.states([f"{ORG}/b"]) == {f"{ORG}/b": LinkState.NOT_CRAWLED}
    finally:
        store.close()


def test_a_failed_origin_write_in_a_group_forgets_the_groups_links(tmp_path: Path) -> None:
    """A write outside `Store.record` failing inside a group rolls back the group's links too:
    the seen cache must not remember them as inserted (they would never be upserted again)."""
    store = SqliteStore(str(tmp_path / "c.db"))
    try:
        store.add_origins([ORG])
        store.commit_interval = 60.0
        assert store.states([f"{ORG}/a"]) == {}  # the cache now knows it is absent…
        store.add_links([Link(f"{ORG}/a", ORG, 0, 1.0)])  # …and then inserted with this score
        with pytest.raises(TypeError), store._tx():
            raise TypeError("a failing write")
        assert store.add_links([Link(f"{ORG}/a", ORG, 0, 1.0)]) == 1  # sent again, inserted
        store.flush()
        assert store.states([f"{ORG}/a"]) == {f"{ORG}/a": LinkState.NOT_CRAWLED}
    finally:
        store.close()
