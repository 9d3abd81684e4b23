"""`courtly report`: one self-contained HTML file with the charts of a crawl, from its crawl log.

The page's script, style and data are inline (nothing is fetched when it is opened, so it can be
attached to a ticket or a mail); its Content-Security-Policy allows that one script (by its
hash) and nothing else, and the data (URLs and server messages from the web) is JSON in a
non-executed script element, drawn as text.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

from courtly.model import ERRORS
from courtly.stats import RESPONSE_BUCKETS
from courtly.store.reader import Reader
from courtly.view.database import CHUNK
from courtly.view.server import static_file
from courtly.view.tally import Tally


def read_log(reader: Reader) -> Tally:
    """The whole crawl log summed up."""
    tally = Tally()
    while True:
        rows = reader.log_after(tally.last_id, CHUNK)
        tally.add(rows, time.time())
        if len(rows) < CHUNK:
            return tally


def report_data(reader: Reader, tally: Tally) -> dict[str, Any]:
    """What the report shows, as JSON."""
    return {
        "db": reader.where, "generated": time.time(), "first": tally.first, "last": tally.last,
        "actions": tally.rows, "requests": tally.requests, "errors": tally.errors,
        "bytes": tally.bytes, "origins": len(tally.origins),
        "exit_codes": dict(tally.exit_codes.most_common()), "error_codes": sorted(ERRORS),
        "series": tally.series.data() if tally.series else {
            "start": 0, "step": 1, "actions": [], "requests": []},
        "elapsed": {"bounds": list(RESPONSE_BUCKETS), "counts": tally.elapsed,
                    "sum": tally.elapsed_sum},
        "slowest": tally.slowest_origins(), "failing": tally.failing_origins(),
        "latest_errors": list(reversed(tally.latest_errors))[:20],
    }


def render(data: dict[str, Any]) -> str:
    """The report page with its script, style and data inline."""
    script = (static_file("chart.js") + static_file("report.js")).decode()
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    # as JSON text inside <script>: no "<" can close the element or open a comment
    payload = (json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")
               .replace(">", "\\u003e").replace("&", "\\u0026"))
    parts = {"SCRIPT_HASH": f"sha256-{digest}", "STYLE": static_file("view.css").decode(),
             "DATA": payload, "SCRIPT": script}
    # one pass: what is put in is never searched for marks again
    return re.sub(r"/\*([A-Z_]+)\*/", lambda m: parts[m.group(1)],
                  static_file("report.html").decode())


def write_report(reader: Reader, out: Path) -> int:
    """Write the report of the reader's crawl database to `out`; returns the crawl actions."""
    tally = read_log(reader)
    out.write_text(render(report_data(reader, tally)), encoding="utf-8")
    return tally.rows
