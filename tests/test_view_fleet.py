"""The live view of a PostgreSQL fleet: each worker's own view (`worker --serve`), and
`courtly serve` of the fleet's database with its workers, leases and rates."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from courtly.site import LocalSite, Page, html
from tests.conftest import courtly
from tests.pgserver import PgUrl
from tests.test_distributed import fleet_config
from tests.viewing import chromium, screenshot, serving, until

pytestmark = pytest.mark.postgres

NAMES = ("f0", "f1", "f2", "f3")


def fleet_site(serve: Any) -> LocalSite:
    sites: dict[str, dict[str, Page]] = {}
    for name in NAMES:
        pages = {"/": Page(html(name, [f"/p{k}" for k in range(60)]))}
        for k in range(60):
            pages[f"/p{k}"] = Page(html(f"{name} {k}", [], body=f"{name} text {k}"), delay=0.02)
        sites[name] = pages
    return serve(sites)


def test_the_view_of_a_fleet_names_its_workers_and_their_leases(
    serve: Any, pg_url: PgUrl, tmp_path: Path
) -> None:
    site = fleet_site(serve)
    assert courtly("add-seeds", *(site.url(n) for n in NAMES), "--db", pg_url).status == 0
    with ExitStack() as stack:
        workers = [stack.enter_context(serving(
            "worker", "--db", pg_url, "--min-delay", "0.1", "--progress", "off", "--continuous",
            "--serve", "0", "--config", fleet_config(tmp_path))) for _ in range(2)]
        view = stack.enter_context(serving("serve", "--db", pg_url, "--port", "0"))
        ids = [w.json("api/summary")["worker"] for w in workers]
        assert all(ids) and ids[0] != ids[1]
        # each worker's own metrics, labelled with its id; the fleet sends requests (not each
        # worker: a worker that leased first keeps the partitions its busy origins are in and
        # hands back idle ones, so the other may get none of the 4 origins in a short crawl)
        for worker, wid in zip(workers, ids, strict=True):
            metrics = worker.metrics()
            labels = {s.labels.get("worker") for f in metrics.values() for s in f.samples}
            assert labels == {wid}
            assert worker.json("api/workers")["fleet"] is True
        until(lambda: sum(s.value for w in workers
                          for s in w.metrics()["courtly_requests"].samples) > 0,
              message="the fleet sent no request")
        # the database's view: both workers, each with leases
        fleet = until(lambda: (f := view.json("api/workers")) and len(
            [w for w in f["workers"] if w["state"] in ("busy", "idle") and w["leases"]]) == 2
            and f, message="two live workers with leases")
        assert {w["worker"] for w in fleet["workers"]} == set(ids)
        assert sum(w["leases"] for w in fleet["workers"]) + fleet["free_partitions"] == 16
        first = view.metrics()
        leased = {s.labels["worker"] for s in first["courtly_worker_leases"].samples}
        assert leased == set(ids)
        until(lambda: sum(s.value for s in view.metrics()["courtly_crawl_actions"].samples) >
              sum(s.value for s in first["courtly_crawl_actions"].samples),
              message="the fleet's crawl actions did not grow")
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(view.url)
            page.wait_for_function("() => !document.getElementById('fleet').hidden && "
                                   "document.querySelectorAll('#workers tbody tr').length === 2")
            shown = [td.text_content() for td in page.query_selector_all(
                "#workers tbody tr td:first-child")]
            assert sorted(shown) == sorted(ids)
            page.wait_for_function(
                "o => [...document.querySelectorAll('#origins td.origin')]"
                ".some(td => td.textContent === o)", arg=site.url("f0", ""))
            screenshot(page, "view-fleet.png")
