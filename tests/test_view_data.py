"""The view's bounded data: the rate chart's bins and the crawl log's sums."""

from __future__ import annotations

import tracemalloc

from courtly.store.reader import LogRow
from courtly.view.origins import OriginTable, OriginView
from courtly.view.series import MAX_BINS, Series
from courtly.view.tally import Tally


def test_a_long_crawl_keeps_a_bounded_number_of_bins_and_every_count() -> None:
    series = Series(1000.0)
    for second in range(100_000):
        series.add(1000.0 + second, 2, 3)
    data = series.data()
    assert len(data["actions"]) <= MAX_BINS and data["step"] >= 100_000 / MAX_BINS
    assert sum(data["actions"]) == 200_000 and sum(data["requests"]) == 300_000
    actions, requests = series.rate(1000.0 + 100_000, window=10)
    assert 1.5 < actions < 2.5 and 2.5 < requests < 3.5  # about 2 and 3 a second


def row(id: int, code: str = "OK", origin: str = "http://a.test") -> LogRow:
    return LogRow(id, 1000.0 + id, 0.1, code, origin, 200, 10, None, None)


def test_rows_committed_out_of_order_are_counted_once() -> None:
    tally = Tally()
    tally.add([row(1), row(2), row(5)], now=0.0, track_gaps=True)
    assert sorted(tally.gaps) == [3, 4] and tally.rows == 3
    # the next read asks for the gaps again: late rows come, known ones are not counted twice
    tally.add([row(3, "HTTP_SERVER_ERROR"), row(5), row(6)], now=1.0, track_gaps=True)
    assert tally.rows == 5 and sorted(tally.gaps) == [4]
    assert tally.exit_codes == {"OK": 4, "HTTP_SERVER_ERROR": 1}
    assert tally.origins["http://a.test"].errors == 1
    tally.add([], now=100.0, track_gaps=True)  # a gap never filled (a rolled-back row) expires
    assert tally.gaps == {}


def test_asking_for_many_limits_does_not_grow_the_origins_table() -> None:
    """`courtly serve` of a finished crawl keeps one origins table for ever; every distinct
    `/api/origins?limit=N` kept one more sorted copy of it (5,000 requests: +28 MB)."""
    table = OriginTable([OriginView(f"http://{k}.test", "finished", "", k, k % 7, 1.0,
                                    "404: allow all") for k in range(50)])
    first = table.page("errors", True, 10)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for limit in range(1, 2000):
            page = table.page("actions", limit % 2 == 0, limit)
            assert len(page["origins"]) == min(limit, 50)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 1_000_000, grown
    assert table.page("errors", True, 10) == first
    assert [o["actions"] for o in table.page("actions", True, 10**30)["origins"]] == list(
        range(49, -1, -1))
