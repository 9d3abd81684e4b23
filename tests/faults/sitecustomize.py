"""Fault injection for the courtly processes a test starts with this directory on PYTHONPATH
(`tests.conftest.with_sqlite_pragmas`, `tests.conftest.time_moved`); the product knows nothing
of it.

FAULT_TIME_OFFSET=SECONDS moves courtly's wall clock (courtly.clock) forward that far.

FAULT_SQLITE_PRAGMAS="max_page_count=400;query_only=1" runs those PRAGMAs on every SQLite
connection the process opens: SQLite's own limits then simulate a full disk (SQLITE_FULL) or an
unwritable file (SQLITE_READONLY), which root cannot get from chmod.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

_PRAGMAS = [p.strip() for p in os.environ.get("FAULT_SQLITE_PRAGMAS", "").split(";") if p.strip()]

if os.environ.get("FAULT_TIME_OFFSET"):
    from courtly import clock

    clock._offset = float(os.environ["FAULT_TIME_OFFSET"])

if _PRAGMAS:
    _connect = sqlite3.connect

    def _connect_with_pragmas(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        db = _connect(*args, **kwargs)
        for pragma in _PRAGMAS:
            db.execute(f"PRAGMA {pragma}")
        return db

    sqlite3.connect = _connect_with_pragmas
