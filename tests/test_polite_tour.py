"""Politeness as a site owner sees it in the access log: servers that rate limit, fail and
misbehave as real ones do, each request's start and end recorded on the server's side."""

from __future__ import annotations

import itertools
from pathlib import Path

from courtly.site import Page
from tests.conftest import courtly
from tests.test_politeness import config, gaps

BUSY = Page("busy", 503, {"Content-Type": "text/plain"})


def test_a_server_503_for_an_hour_sees_the_backoff_grow(serve, db: Path, tmp_path: Path) -> None:
    """A pause longer than `backoff_forgive_after` counted as the quiet time that forgives the
    backoff: a server answering 503 to every request saw the waits grow to that length, then
    fall back to `backoff_base` and grow again, for as long as it stayed down. The quiet time
    now starts when the pause ends."""
    site = serve({"a": {"/": BUSY}})
    cfg = config(tmp_path, "[politeness]\nbackoff_base = 0.1\nbackoff_forgive_after = 0.3\n"
                           "max_retries = 4\n")
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--config", cfg)
    assert run.status == 0, run.err
    waits = gaps(site.hits_for("a")[1:])  # after robots.txt
    assert len(waits) == 4
    for shorter, longer in itertools.pairwise(waits):  # doubling, × a jitter of 1 to 1.5
        assert longer >= 1.3 * shorter, waits
