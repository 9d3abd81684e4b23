"""The one clock courtly reads wall time from.

Recrawl times are days apart, so the tests move this clock forward: in their own process
(`tests.conftest.move_clock`) and in the courtly processes they start (`tests.conftest.time_moved`,
through tests/faults/sitecustomize.py). The product has no knob for it: nothing but a test
changes `_offset`.
"""

from __future__ import annotations

import time

_offset = 0.0  # seconds added to the system's wall clock


def now() -> float:
    """Seconds since the epoch."""
    return time.time() + _offset
