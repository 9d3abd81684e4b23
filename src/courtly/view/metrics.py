"""/metrics: the view's numbers in the Prometheus text format (prometheus_client).

Built at scrape time from what the view already holds (a custom collector: the crawl itself
only bumps plain integers). Label values are bounded: exit codes, origin states, and in a fleet
the worker ids; never a URL or an origin.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from courtly.stats import RESPONSE_BUCKETS
from courtly.view.origins import OriginTable

if TYPE_CHECKING:
    from courtly.view.database import DbView
    from courtly.view.live import LiveView


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def exposition(families: list[Metric]) -> bytes:
    """The families in the Prometheus text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


def _histogram(name: str, doc: str, labels: list[str], values: list[str], counts: list[int],
               total: float) -> HistogramMetricFamily:
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip([*map(str, RESPONSE_BUCKETS), "+Inf"], counts, strict=True):
        running += count
        buckets.append((bound, running))
    family = HistogramMetricFamily(name, doc, labels=labels)
    family.add_metric(values, buckets, total)
    return family


def _origins(table: OriginTable, labels: list[str], values: list[str]) -> GaugeMetricFamily:
    family = GaugeMetricFamily("courtly_origins", "Origins by state.",
                               labels=[*labels, "state"])
    for state, n in table.states.items():
        family.add_metric([*values, state.replace(" ", "_")], n)
    return family


def _counter(name: str, doc: str, labels: list[str], values: list[str],
             value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    family.add_metric(values, value)
    return family


def _by_exit_code(counts: dict[str, int], labels: list[str],
                  values: list[str]) -> CounterMetricFamily:
    family = CounterMetricFamily("courtly_crawl_actions", "Crawl actions by exit code.",
                                 labels=[*labels, "exit_code"])
    for code, n in sorted(counts.items()):
        family.add_metric([*values, code], n)
    return family


async def live_families(view: LiveView) -> list[Metric]:
    """A running crawl's metrics (in a fleet, labelled with this worker's id)."""
    stats = view.crawl.stats
    table = await view.origins()
    labels, values = (["worker"], [view.worker]) if view.worker else ([], [])
    in_flight = GaugeMetricFamily("courtly_requests_in_flight",
                                  "Origins with a turn (and so a request) running now.",
                                  labels=labels)
    in_flight.add_metric(values, stats.in_flight)
    return [
        _counter("courtly_requests", "HTTP requests sent (robots.txt included).", labels, values,
                 stats.requests),
        _by_exit_code(dict(stats.exit_codes), labels, values),
        _counter("courtly_response_bytes", "Bytes of page response bodies.", labels, values,
                 stats.response_bytes),
        _histogram("courtly_response_seconds", "Page response time: request sent to body read.",
                   labels, values, stats.response_times, stats.response_seconds),
        _origins(table, labels, values),
        in_flight,
    ]


async def database_families(view: DbView) -> list[Metric]:
    """A crawl database's metrics, from its crawl log; in a fleet, per worker too."""
    tally = view.tally
    table = await view.origins()
    fleet = await view.workers()
    families: list[Metric] = [
        _counter("courtly_requests", "Crawl actions in the log that sent a request "
                 "(robots.txt requests are not logged).", [], [], tally.requests),
        _by_exit_code(dict(tally.exit_codes), [], []),
        _counter("courtly_response_bytes", "Bytes of the logged responses' bodies.", [], [],
                 tally.bytes),
        _histogram("courtly_crawl_action_seconds", "Time of the logged crawl actions that sent a "
                   "request (fetch and handling).", [], [], tally.elapsed, tally.elapsed_sum),
        _origins(table, [], []),
    ]
    if fleet["fleet"]:
        families.extend(_fleet(fleet))
    return families


def _fleet(fleet: dict[str, Any]) -> Iterable[Metric]:
    actions = CounterMetricFamily("courtly_worker_crawl_actions",
                                  "Crawl actions of each worker (its last heartbeat).",
                                  labels=["worker"])
    leases = GaugeMetricFamily("courtly_worker_leases", "Partitions each worker leases.",
                               labels=["worker"])
    up = GaugeMetricFamily("courtly_worker_up", "1 when the worker's heartbeat is current.",
                           labels=["worker"])
    for w in fleet["workers"]:
        actions.add_metric([w["worker"]], w["actions"])
        leases.add_metric([w["worker"]], w["leases"])
        up.add_metric([w["worker"]], 1 if w["state"] in ("busy", "idle") else 0)
    free = GaugeMetricFamily("courtly_partitions_free", "Partitions no worker leases.",
                             value=fleet["free_partitions"])
    return [actions, leases, up, free]
