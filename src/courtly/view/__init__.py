"""The live view of a crawl: a web page, JSON endpoints, Prometheus metrics, and the report.

`live` reads a running crawl's counters, `database` a crawl database's log; both answer the same
questions (`View`), which `server` serves and `metrics` exports; `report` writes one HTML file.
"""
