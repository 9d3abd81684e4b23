"""The one clock courtly reads wall time from; tests move it forward with COURTLY_TIME_OFFSET."""

from __future__ import annotations

import contextlib
import math
import os
import time

_offset = [0.0]  # seconds; read from the environment when a command starts


def read_offset() -> None:
    """Read COURTLY_TIME_OFFSET (each command does at its start, so a test can move time between
    runs in one process; not at each `now()`: an environment lookup per call was 1 % of a crawl).
    ValueError if it is not a number of seconds."""
    value = float(os.environ.get("COURTLY_TIME_OFFSET", "0") or 0)
    if not math.isfinite(value):
        raise ValueError(value)
    _offset[0] = value


def now() -> float:
    """Seconds since the epoch, shifted by COURTLY_TIME_OFFSET (for recrawl tests)."""
    return time.time() + _offset[0]


with contextlib.suppress(ValueError):  # a bad value is reported when a command starts
    read_offset()
