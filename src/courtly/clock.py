"""The one clock courtly reads wall time from; tests move it forward with COURTLY_TIME_OFFSET."""

from __future__ import annotations

import os
import time

_offset = [0.0]  # seconds; read from the environment when a command starts


def read_offset() -> None:
    """Read COURTLY_TIME_OFFSET (each command does at its start, so a test can move time between
    runs in one process; not at each `now()`: an environment lookup per call was 1 % of a crawl)."""
    _offset[0] = float(os.environ.get("COURTLY_TIME_OFFSET", "0") or 0)


def now() -> float:
    """Seconds since the epoch, shifted by COURTLY_TIME_OFFSET (for recrawl tests)."""
    return time.time() + _offset[0]


read_offset()
