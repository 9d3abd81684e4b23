"""The one clock courtly reads wall time from; tests move it forward with COURTLY_TIME_OFFSET."""

from __future__ import annotations

import os
import time


def offset() -> float:
    """COURTLY_TIME_OFFSET in seconds (read each time, so a test can move time between runs)."""
    return float(os.environ.get("COURTLY_TIME_OFFSET", "0") or 0)


def now() -> float:
    """Seconds since the epoch, shifted by COURTLY_TIME_OFFSET (for recrawl tests)."""
    return time.time() + offset()
