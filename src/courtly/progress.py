"""Progress while crawling (a live display on a terminal, a log line every few seconds
otherwise) and the stats tables."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

if TYPE_CHECKING:
    from courtly.stats import CrawlStats

LOG_EVERY = 5.0


def _line(stats: CrawlStats, whose: str) -> str:
    return (
        f"{stats.actions} actions ({stats.exit_codes.get('OK', 0)} OK, {stats.errors} errors), "
        f"{stats.rate:.1f}/s, {stats.requests} requests, {whose}origins "
        f"{stats.origins_total - stats.origins_finished} active / "
        f"{stats.origins_finished} finished, {stats.in_flight} in flight"
    )


class Progress:
    """Shows CrawlStats as they change: mode auto (live on a terminal), live, log or off; a
    fleet's worker counts the origins it crawled ("this worker's origins"), not the fleet's."""

    def __init__(self, mode: str, worker: bool = False) -> None:
        if mode == "auto":
            mode = "live" if sys.stderr.isatty() else "log"
        self.mode = mode
        self.console = Console(stderr=True)
        self._live: Live | None = None
        self._last_log = time.monotonic()
        self._whose = "this worker's " if worker else ""

    def __enter__(self) -> Progress:
        if self.mode == "live":
            self._live = Live(console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def update(self, stats: CrawlStats) -> None:
        """Called twice a second by the crawler."""
        if self._live is not None:
            self._live.update(f"[bold]courtly[/] {_line(stats, self._whose)}")
        elif self.mode == "log" and time.monotonic() - self._last_log >= LOG_EVERY:
            self._last_log = time.monotonic()
            print(f"courtly: {_line(stats, self._whose)}", file=sys.stderr, flush=True)

    def summary(self, stats: CrawlStats) -> None:
        """The last word of a crawl (printed whatever the mode)."""
        codes = ", ".join(f"{k} {v}" for k, v in stats.exit_codes.most_common())
        print(f"courtly: {stats.stop_reason}. {_line(stats, self._whose)}", file=sys.stderr)
        if codes:
            print(f"courtly: exit codes: {codes}", file=sys.stderr)
        _origins_line("stopped early", stats.stopped_early, " (-v logs each)")
        _origins_line(f"asked a Crawl-delay above max_crawl_delay {stats.clamped_to:g}s, crawled "
                      "at that delay", {o: f"Crawl-delay {d:g}" for o, d in stats.clamped.items()})


def _origins_line(what: str, origins: dict[str, str], more_note: str = "") -> None:
    """One last line naming the first three origins of `what` with their reasons."""
    if not origins:
        return
    listed = "; ".join(f"{origin}: {why}" for origin, why in list(origins.items())[:3])
    more = f"; and {len(origins) - 3} more{more_note}" if len(origins) > 3 else ""
    print(f"courtly: {len(origins)} origin(s) {what}: {listed}{more}", file=sys.stderr)


def print_stats(data: dict[str, Any]) -> None:
    """`courtly stats`: three small tables."""
    console = Console()
    console.print(f"[bold]{data['candidates']}[/] crawl candidates, {data['runs']} runs")
    for title, key in (("link state", "by_state"), ("last exit code", "by_exit_code"),
                       ("crawl actions by exit code", "actions_by_exit_code")):
        table = Table(title=title, title_justify="left")
        table.add_column(title)
        table.add_column("count", justify="right")
        for name, count in sorted(data[key].items(), key=lambda kv: -kv[1]):
            table.add_row(name, str(count))
        console.print(table)
    states = ["NOT_CRAWLED", "QUEUED", "CRAWLED", "ERROR"]
    table = Table(title="by origin", title_justify="left")
    table.add_column("origin")
    for state in states:
        table.add_column(state, justify="right")
    for origin, counts in sorted(data["by_origin"].items()):
        table.add_row(origin, *(str(counts.get(s, 0)) for s in states))
    console.print(table)
